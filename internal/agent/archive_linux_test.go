package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/archive"
)

// writeTarRemote sends tb through WriteTar in 64 KiB chunks.
func (env *testEnv) writeTarRemote(ctx context.Context, hdr *agentv1.WriteTarHeader, tb []byte) (*agentv1.WriteTarResponse, error) {
	stream := env.c.Files.WriteTar(ctx)
	if err := stream.Send(&agentv1.WriteTarRequest{Msg: &agentv1.WriteTarRequest_Header{Header: hdr}}); err != nil {
		_, err2 := stream.CloseAndReceive()
		return nil, err2
	}
	for i := 0; i < len(tb); i += 64 << 10 {
		if err := stream.Send(&agentv1.WriteTarRequest{Msg: &agentv1.WriteTarRequest_Data{Data: tb[i:min(len(tb), i+64<<10)]}}); err != nil {
			break // the real error comes from CloseAndReceive
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// readTarRemote reads a tar of p through ReadTar.
func (env *testEnv) readTarRemote(ctx context.Context, p string) ([]byte, error) {
	stream, err := env.c.Files.ReadTar(ctx, connect.NewRequest(&agentv1.ReadTarRequest{Path: p}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var b bytes.Buffer
	for stream.Receive() {
		b.Write(stream.Msg().GetData())
	}
	return b.Bytes(), stream.Err()
}

type tarEnt struct {
	typ              byte
	name, body, link string
	mode             int64
}

func buildTar(t *testing.T, ents ...tarEnt) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body)), ModTime: time.Unix(1_600_000_000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestWriteTarReadTarRoundTrip: a tree goes in through WriteTar (into a
// directory that is made) and comes back out through ReadTar with modes,
// symlinks and hard links kept, set-id bits dropped, and (as root) every
// entry owned by the user asked for.
func TestWriteTarReadTarRoundTrip(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	base := t.TempDir()
	tb := buildTar(t,
		tarEnt{typ: tar.TypeDir, name: "./", mode: 0o700},
		tarEnt{typ: tar.TypeDir, name: "./bin/", mode: 0o755},
		tarEnt{typ: tar.TypeReg, name: "./bin/run", body: "#!/bin/sh\n", mode: 0o4755},
		tarEnt{typ: tar.TypeReg, name: "./secret", body: "s", mode: 0o600},
		tarEnt{typ: tar.TypeReg, name: "./deep/er/file", body: "implicit parents", mode: 0o640},
		tarEnt{typ: tar.TypeSymlink, name: "./link", link: "bin/run"},
		tarEnt{typ: tar.TypeSymlink, name: "./abs", link: "/etc/hostname"},
		tarEnt{typ: tar.TypeLink, name: "./hard", link: "./secret"},
		tarEnt{typ: tar.TypeDir, name: "./ro/", mode: 0o555},
	)
	dest := filepath.Join(base, "made", "dest")
	hdr := &agentv1.WriteTarHeader{Path: dest}
	root := os.Geteuid() == 0
	if root {
		hdr.User = "alice"
	}
	resp, err := env.writeTarRemote(t.Context(), hdr, tb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dest, "ro"), 0o755) })
	// 8 entries ("./" only counts) and 2 implicit parents.
	if resp.GetEntries() != 10 || resp.GetBytes() != uint64(len("#!/bin/sh\n")+len("s")+len("implicit parents")) {
		t.Errorf("response %v", resp)
	}
	for name, want := range map[string]fs.FileMode{
		"bin": fs.ModeDir | 0o755, "bin/run": 0o755, "secret": 0o600, "deep/er/file": 0o640,
		"ro": fs.ModeDir | 0o555, "link": fs.ModeSymlink | 0o777, "abs": fs.ModeSymlink | 0o777,
	} {
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
		if st := fi.Sys().(*syscall.Stat_t); root && (st.Uid != 1234 || st.Gid != 1234) {
			t.Errorf("%s: owner %d:%d, want alice (1234:1234)", name, st.Uid, st.Gid)
		}
	}
	if l, _ := os.Readlink(filepath.Join(dest, "abs")); l != "/etc/hostname" {
		t.Errorf("abs -> %q", l)
	}
	a, _ := os.Stat(filepath.Join(dest, "secret"))
	h, _ := os.Stat(filepath.Join(dest, "hard"))
	if a == nil || h == nil || !os.SameFile(a, h) {
		t.Error("hard is not a link to secret")
	}

	out, err := env.readTarRemote(t.Context(), dest)
	if err != nil {
		t.Fatal(err)
	}
	back := t.TempDir()
	if _, err := archive.Extract(t.Context(), bytes.NewReader(out), back, archive.ExtractOptions{From: "dest"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(back, "ro"), 0o755) })
	if b, err := os.ReadFile(filepath.Join(back, "deep", "er", "file")); err != nil || string(b) != "implicit parents" {
		t.Errorf("deep/er/file back: %q, %v", b, err)
	}
	if l, _ := os.Readlink(filepath.Join(back, "link")); l != "bin/run" {
		t.Errorf("link back -> %q", l)
	}
	if fi, err := os.Stat(filepath.Join(back, "secret")); err != nil || fi.Mode() != 0o600 {
		t.Errorf("secret back: %v, %v", fi, err)
	}

	// A single file comes out as one entry named by its base.
	out, err = env.readTarRemote(t.Context(), filepath.Join(dest, "secret"))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	if h, err := tr.Next(); err != nil || h.Name != "secret" || h.Size != 1 {
		t.Errorf("single file: %v, %v", h, err)
	}
}

// TestWriteTarHostile: hostile archives fail with InvalidArgument and
// leave the directory next to the destination as it was.
func TestWriteTarHostile(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	for name, tb := range map[string][]byte{
		"dotdot":   buildTar(t, tarEnt{typ: tar.TypeReg, name: "../outside/escape", body: "x"}),
		"absolute": buildTar(t, tarEnt{typ: tar.TypeReg, name: "/tmp/airlock-escape", body: "x"}),
		"symlink then file": buildTar(t,
			tarEnt{typ: tar.TypeSymlink, name: "up", link: "../outside"},
			tarEnt{typ: tar.TypeReg, name: "up/escape", body: "x"}),
		"absolute symlink then file": buildTar(t,
			tarEnt{typ: tar.TypeSymlink, name: "up", link: "/tmp"},
			tarEnt{typ: tar.TypeReg, name: "up/airlock-escape", body: "x"}),
		"hard link out": buildTar(t, tarEnt{typ: tar.TypeLink, name: "h", link: "../outside/canary"}),
		"device":        buildTar(t, tarEnt{typ: tar.TypeChar, name: "null"}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			if err := os.Mkdir(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "canary"), []byte("canary"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: filepath.Join(base, "dest")}, tb)
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("WriteTar = %v, want InvalidArgument", err)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("outside has %d entries, want only the canary", len(ents))
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "canary")); string(b) != "canary" {
				t.Errorf("canary = %q", b)
			}
			if _, err := os.Lstat("/tmp/airlock-escape"); err == nil {
				t.Error("/tmp/airlock-escape exists")
			}
		})
	}
}

func TestArchiveErrors(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	writeFile(t, file, "x")
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	ok := buildTar(t, tarEnt{typ: tar.TypeReg, name: "a", body: "a"})

	if _, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: file}, ok); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("WriteTar into a file: %v, want FailedPrecondition", err)
	}
	if _, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: "rel"}, ok); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("WriteTar to a relative path: %v, want InvalidArgument", err)
	}
	if _, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: dir, User: "nosuchuser"}, ok); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("WriteTar as an unknown user: %v, want NotFound", err)
	}
	// tar's own padding after the end marker is fine; a megabyte more is not.
	padded := append(bytes.Clone(ok), make([]byte, 10<<10)...)
	if _, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: filepath.Join(dir, "padded")}, padded); err != nil {
		t.Errorf("WriteTar with padding: %v", err)
	}
	trailing := append(bytes.Clone(ok), bytes.Repeat([]byte("x"), 2<<20)...)
	if _, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: filepath.Join(dir, "trailing")}, trailing); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("WriteTar with trailing data: %v, want InvalidArgument", err)
	}
	if _, err := env.writeTarRemote(t.Context(), &agentv1.WriteTarHeader{Path: filepath.Join(dir, "junk")}, []byte(strings.Repeat("junk", 200))); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("WriteTar of junk: %v, want InvalidArgument", err)
	}

	for p, want := range map[string]connect.Code{
		"/":                           connect.CodeInvalidArgument,
		filepath.Join(dir, "fifo"):    connect.CodeFailedPrecondition,
		filepath.Join(dir, "missing"): connect.CodeNotFound,
	} {
		if _, err := env.readTarRemote(t.Context(), p); connect.CodeOf(err) != want {
			t.Errorf("ReadTar %s: %v, want %v", p, err, want)
		}
	}
}
