package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
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
			c, err := g.remote()
			if err != nil {
				return err
			}
			if recursive {
				return copyTree(cmd, g, c, args)
			}
			if c != nil {
				if dRemote {
					return remoteCopyIn(cmd, g, c, args[0], did, dpath)
				}
				return remoteCopyOut(cmd, c, sid, spath, args[1])
			}
			m, done, err := g.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			ctx := cmd.Context()
			if dRemote {
				if _, err := m.Get(ctx, sandbox.Local(), did); err != nil {
					return err
				}
				n, err := copyIn(ctx, m, did, args[0], dpath)
				if err != nil {
					return err
				}
				g.log.Info("copied", "bytes", n)
				return nil
			}
			if _, err := m.Get(ctx, sandbox.Local(), sid); err != nil {
				return err
			}
			// A hostile guest must not fill the host's disk: the manager
			// refuses more than the sandbox's disk size.
			_, err = copyOut(ctx, m, sid, spath, args[1])
			return err
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy directories (as tar streams); - as the local side is a tar on stdin or stdout")
	return cmd
}

// copyTree is cp -r, locally (the manager) or through the API server c.
// A regular file goes as plain cp copies it.
func copyTree(cmd *cobra.Command, g *globals, c *airlock.Client, args []string) error {
	ctx := cmd.Context()
	sid, spath, sRemote := splitRemote(args[0])
	did, dpath, _ := splitRemote(args[1])
	id := did
	if sRemote {
		id = sid
	}
	var sfs sandboxFS
	if c != nil {
		if _, err := c.Get(ctx, id); err != nil {
			return err
		}
		sfs = remoteFS{c, id}
	} else {
		m, done, err := g.manager(ctx)
		if err != nil {
			return err
		}
		defer done()
		if _, err := m.Get(ctx, sandbox.Local(), id); err != nil {
			return err
		}
		sfs = localFS{m, id}
	}
	prog := terminalOrNil(cmd.ErrOrStderr())
	if !sRemote {
		res, err := copyTreeIn(ctx, sfs, cmd.InOrStdin(), prog, args[0], dpath)
		if errors.Is(err, errNotDir) {
			if c != nil {
				return remoteCopyIn(cmd, g, c, args[0], did, dpath)
			}
			n, err := copyIn(ctx, sfs.(localFS).m, did, args[0], dpath)
			if err == nil {
				g.log.Info("copied", "bytes", n)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("copy to %s: %w", dpath, err)
		}
		g.log.Info("copied", "entries", res.Entries, "bytes", res.Bytes)
		return nil
	}
	st, err := copyTreeOut(ctx, sfs, cmd.OutOrStdout(), prog, spath, args[1])
	if errors.Is(err, errNotDir) {
		if c != nil {
			return remoteCopyOut(cmd, c, sid, spath, args[1])
		}
		_, err = copyOut(ctx, sfs.(localFS).m, sid, spath, args[1])
		return err
	}
	if err != nil {
		return fmt.Errorf("copy from %s: %w", spath, err)
	}
	g.log.Info("copied", "entries", st.Entries(), "bytes", st.Bytes)
	return nil
}

func copyIn(ctx context.Context, m *sandbox.Manager, id, local, remote string) (int64, error) {
	f, fi, err := openRegular(local)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if strings.HasSuffix(remote, "/") {
		remote += filepath.Base(local)
	} else if st, err := m.StatFile(ctx, sandbox.Local(), id, path.Clean(remote)); err == nil && st.Type == guest.FileDirectory {
		remote = path.Join(remote, filepath.Base(local))
	}
	remote = path.Clean(remote)
	if err := shim.ValidateGuestPath(remote); err != nil {
		return 0, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	n, err := m.WriteFile(ctx, sandbox.Local(), id, remote, uint32(fi.Mode().Perm()), f)
	if err != nil {
		return n, fmt.Errorf("copy to %s: %w", remote, err)
	}
	return n, nil
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

// copyOut copies a guest file to local (at most the sandbox's disk size).
func copyOut(ctx context.Context, m *sandbox.Manager, id, remote, local string) (int64, error) {
	if err := shim.ValidateGuestPath(remote); err != nil {
		return 0, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	return writeLocal(local, path.Base(remote), func(tmp *os.File) (int64, os.FileMode, error) {
		var mode os.FileMode = 0o644
		n, err := m.ReadFile(ctx, sandbox.Local(), id, remote, tmp, func(fi guest.FileInfo) { mode = os.FileMode(fi.Mode & 0o777) })
		if err != nil {
			return n, 0, fmt.Errorf("copy from %s: %w", remote, err)
		}
		return n, mode, nil
	})
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
