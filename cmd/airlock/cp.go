package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// splitRemote parses "ID:/path". ok is false for a local path.
func splitRemote(s string) (id, p string, ok bool) {
	id, p, found := strings.Cut(s, ":")
	if !found || statedir.ValidateID(id) != nil {
		return "", "", false
	}
	return id, p, true
}

func cpCmd(g *globals) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "cp [-r] SRC DST",
		Short: "Copy a file or, with -r, a directory into (LOCAL ID:/PATH) or out of (ID:/PATH LOCAL) a sandbox",
		Long: `Copy a file into (LOCAL ID:/PATH) or out of (ID:/PATH LOCAL) a sandbox.

With -r, directories are copied too, as tar streams, keeping permission bits,
symlinks (as symlinks), hard links and mtimes, as docker cp does:
  - DST does not exist: it is made and gets SRC's contents;
  - DST is a directory: SRC lands in it as DST/NAME, or, when SRC ends in "/.",
    SRC's contents land in DST;
  - DST is not a directory: an error.
"-" as the local side is a tar stream: on stdin into ID:/DIR, or of ID:/PATH to
stdout (entries named NAME/...). Files copied in belong to root; files copied
out belong to you, without setuid/setgid bits. Nothing a sandbox sends is ever
written outside DST. On a terminal, the bytes copied so far go to stderr.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sid, spath, sRemote := splitRemote(args[0])
			did, dpath, dRemote := splitRemote(args[1])
			if sRemote == dRemote {
				return fmt.Errorf("%w: exactly one of SRC and DST must be ID:/PATH", errdefs.ErrInvalid)
			}
			if !recursive && (args[0] == "-" || args[1] == "-") {
				return fmt.Errorf("%w: - (a tar stream) needs -r", errdefs.ErrInvalid)
			}
			c, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if recursive {
				return copyTree(cmd, g, c, args)
			}
			if dRemote {
				return copyIn(cmd, g, c, args[0], did, dpath)
			}
			return copyOut(cmd, c, sid, spath, args[1])
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy directories (as tar streams); - as the local side is a tar on stdin or stdout")
	return cmd
}

// copyTree is cp -r through the API client c.
// A regular file goes as plain cp copies it.
func copyTree(cmd *cobra.Command, g *globals, c *airlock.Client, args []string) error {
	ctx := cmd.Context()
	sid, spath, sRemote := splitRemote(args[0])
	did, dpath, _ := splitRemote(args[1])
	id := did
	if sRemote {
		id = sid
	}
	if _, err := c.Get(ctx, id); err != nil {
		return err
	}
	var sfs sandboxFS = apiFS{c, id}
	prog := terminalOrNil(cmd.ErrOrStderr())
	if !sRemote {
		res, err := copyTreeIn(ctx, sfs, cmd.InOrStdin(), prog, args[0], dpath)
		if errors.Is(err, errNotDir) {
			return copyIn(cmd, g, c, args[0], did, dpath)
		}
		if err != nil {
			return fmt.Errorf("copy to %s: %w", dpath, err)
		}
		g.log.Info("copied", "entries", res.Entries, "bytes", res.Bytes)
		return nil
	}
	st, err := copyTreeOut(ctx, sfs, cmd.OutOrStdout(), prog, spath, args[1])
	if errors.Is(err, errNotDir) {
		return copyOut(cmd, c, sid, spath, args[1])
	}
	if err != nil {
		return fmt.Errorf("copy from %s: %w", spath, err)
	}
	g.log.Info("copied", "entries", st.Entries(), "bytes", st.Bytes)
	return nil
}

// openRegular opens local, which must be a regular file, for copying in.
func openRegular(local string) (*os.File, os.FileInfo, error) {
	f, err := os.Open(local)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s is not a regular file", errdefs.ErrInvalid, local)
	}
	return f, fi, nil
}

// writeLocal replaces local (or local/base if local is a directory) with
// what fill writes into a temporary file next to it, then gives it mode.
// On any error the temporary file is removed and local is left as it was.
func writeLocal(local, base string, fill func(tmp *os.File) (int64, os.FileMode, error)) (int64, error) {
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, base)
	}
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".airlock-*")
	if err != nil {
		return 0, err
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	n, mode, err := fill(tmp)
	if err != nil {
		return n, err
	}
	if err := tmp.Chmod(mode); err != nil {
		return n, err
	}
	if err := tmp.Close(); err != nil {
		return n, err
	}
	if err := os.Rename(tmp.Name(), local); err != nil {
		return n, err
	}
	committed = true
	return n, nil
}
