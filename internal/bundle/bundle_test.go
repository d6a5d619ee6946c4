package bundle

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sbID = "abcdefghijklmnopqrst"

func writeFiles(t *testing.T, files map[string]string) []File {
	t.Helper()
	dir := t.TempDir()
	var out []File
	for name, body := range files {
		p := filepath.Join(dir, strings.ReplaceAll(name, "/", "_"))
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		out = append(out, File{Name: name, Path: p})
	}
	return out
}

func TestRoundTripThroughDir(t *testing.T) {
	ctx := t.Context()
	d := Dir{Root: t.TempDir()}
	files := writeFiles(t, map[string]string{"row.json": `{"id":1}`, "state/state.bin": strings.Repeat("m", 100000)})
	first, err := d.Put(ctx, sbID, func(w io.Writer) error { return Write(w, files[:1]) })
	if err != nil {
		t.Fatal(err)
	}
	ref, err := d.Put(ctx, sbID, func(w io.Writer) error { return Write(w, files) })
	if err != nil {
		t.Fatal(err)
	}
	if ref.Digest == first.Digest || ref.Bytes <= 100000 {
		t.Fatalf("refs %+v %+v", first, ref)
	}
	if _, err := d.Open(ctx, first); err == nil {
		t.Fatal("the older bundle is still there after a newer Put")
	}
	rc, err := d.Open(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := t.TempDir()
	got, err := Extract(rc, out, Limits{"row.json": 1 << 10, "state/state.bin": 1 << 20})
	if err != nil || len(got) != 2 {
		t.Fatalf("extract: %v %v", got, err)
	}
	b, err := os.ReadFile(filepath.Join(out, "state", "state.bin"))
	if err != nil || len(b) != 100000 {
		t.Fatalf("state.bin: %d bytes, %v", len(b), err)
	}
	if err := d.Remove(ctx, first); err != nil { // gone already: no error
		t.Fatal(err)
	}
	if rc, err := d.Open(ctx, ref); err != nil {
		t.Fatalf("removing another bundle of the sandbox took this one: %v", err)
	} else {
		rc.Close()
	}
	if err := d.Remove(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open(ctx, ref); err == nil {
		t.Fatal("Open after Remove")
	}
	if _, err := os.Stat(filepath.Join(d.Root, sbID)); !os.IsNotExist(err) {
		t.Fatalf("the sandbox's empty directory stays: %v", err)
	}
}

func TestTamperedBundleIsRefused(t *testing.T) {
	ctx := t.Context()
	d := Dir{Root: t.TempDir()}
	files := writeFiles(t, map[string]string{"row.json": strings.Repeat("x", 5000)})
	ref, err := d.Put(ctx, sbID, func(w io.Writer) error { return Write(w, files) })
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(d.Root, sbID, strings.TrimPrefix(ref.Digest, "sha256:")+".tar")
	b, _ := os.ReadFile(p)
	i := bytes.Index(b, []byte("xxxx"))
	b[i] = 'y' // same size, one byte changed
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := d.Open(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := Extract(rc, t.TempDir(), Limits{"row.json": 1 << 20}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a tampered bundle: %v, want ErrCorrupt", err)
	}
	// Cut short: the digest check fails too.
	if err := os.WriteFile(p, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	rc2, _ := d.Open(ctx, ref)
	defer rc2.Close()
	if _, err := Extract(rc2, t.TempDir(), Limits{"row.json": 1 << 20}); err == nil {
		t.Fatal("a bundle cut short was extracted")
	}
}

func TestExtractRefusesWhatLimitsDoNotAllow(t *testing.T) {
	mk := func(h tar.Header, body string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		h.Size = int64(len(body))
		if h.Typeflag == tar.TypeSymlink {
			h.Size = 0
			body = ""
		}
		_ = tw.WriteHeader(&h)
		_, _ = tw.Write([]byte(body))
		_ = tw.Close()
		return buf.Bytes()
	}
	lim := Limits{"row.json": 10}
	for name, stream := range map[string][]byte{
		"another name": mk(tar.Header{Typeflag: tar.TypeReg, Name: "../escape"}, "x"),
		"over limit":   mk(tar.Header{Typeflag: tar.TypeReg, Name: "row.json"}, strings.Repeat("x", 11)),
		"a symlink":    mk(tar.Header{Typeflag: tar.TypeSymlink, Name: "row.json", Linkname: "/etc/shadow"}, ""),
	} {
		dir := t.TempDir()
		if _, err := Extract(bytes.NewReader(stream), dir, lim); err == nil {
			t.Errorf("%s: extracted", name)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: wrote %d entries", name, len(ents))
		}
	}
	if err := (Ref{Sandbox: "../x", Digest: "sha256:" + strings.Repeat("0", 64), Bytes: 1}).Validate(); err == nil {
		t.Error("a path as a sandbox id passed")
	}
}
