// Package bundle moves a paused sandbox between the nodes of a cluster.
//
// A bundle is one tar stream holding everything a node needs to resume a
// sandbox that another node paused: its catalog row and what it was
// paused with (the guest kernel's and initramfs' digests, the runtime,
// the CPU architecture), the pause's manifest and saved state, the parked
// execs, and its root disk flattened onto the image it was made from (the
// image blob itself is not in it: every node has the images it runs).
//
// A bundle is named by the sha256 of its bytes. The node that writes one
// reports that digest; the control tier keeps it in the cluster's catalog;
// the node that reads it checks every byte against it, so a store that
// was tampered with, or a bundle cut short, is refused, never resumed.
//
// Store is where bundles live between the two nodes. Dir is a directory
// that every node mounts (an NFS or CephFS volume, a ReadWriteMany
// PersistentVolume): the one backend so far.
package bundle

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// Ref names one bundle: the sandbox it holds, the sha256 of its bytes
// ("sha256:<hex>") and their number.
type Ref struct {
	Sandbox string `json:"sandbox"`
	Digest  string `json:"digest"`
	Bytes   int64  `json:"bytes"`
}

var digestRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^sha256:[0-9a-f]{64}$`) })

// Validate checks r's fields before any of them names a file.
func (r Ref) Validate() error {
	if err := statedir.ValidateID(r.Sandbox); err != nil {
		return err
	}
	if !digestRe().MatchString(r.Digest) {
		return fmt.Errorf("%w: bundle digest %q: want sha256:<64 hex digits>", errdefs.ErrInvalid, r.Digest)
	}
	if r.Bytes <= 0 {
		return fmt.Errorf("%w: bundle size %d", errdefs.ErrInvalid, r.Bytes)
	}
	return nil
}

// Store keeps bundles.
type Store interface {
	// Put stores the bytes write writes as sandbox's bundle and drops
	// its older ones. Nothing is stored if write fails.
	Put(ctx context.Context, sandbox string, write func(io.Writer) error) (Ref, error)
	// Open reads ref's bundle. The reader fails, instead of ending, if
	// the bytes are not ref's.
	Open(ctx context.Context, ref Ref) (io.ReadCloser, error)
	// Remove drops ref's bundle (nothing if it is gone).
	Remove(ctx context.Context, ref Ref) error
	// String says where the bundles are, for messages.
	String() string
}

// Dir is a Store in a directory: Root/<sandbox id>/<sha256 hex>.tar.
type Dir struct{ Root string }

func (d Dir) String() string { return d.Root }

func (d Dir) dir(sandbox string) (string, error) {
	if err := statedir.ValidateID(sandbox); err != nil {
		return "", err
	}
	return filepath.Join(d.Root, sandbox), nil
}

// Put implements Store.
func (d Dir) Put(ctx context.Context, sandbox string, write func(io.Writer) error) (Ref, error) {
	dir, err := d.dir(sandbox)
	if err != nil {
		return Ref{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Ref{}, fmt.Errorf("bundle store %s: %w", d.Root, err)
	}
	f, err := os.CreateTemp(dir, ".put-*")
	if err != nil {
		return Ref{}, fmt.Errorf("bundle store %s: %w", d.Root, err)
	}
	tmp := f.Name()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	err = write(cw)
	if err == nil {
		err = ctx.Err()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, sum+".tar"))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return Ref{}, fmt.Errorf("write bundle of %s to %s: %w", sandbox, d.Root, err)
	}
	// The older bundles of this sandbox are stale now.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != sum+".tar" && strings.HasSuffix(e.Name(), ".tar") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	if df, err := os.Open(dir); err == nil {
		_ = df.Sync()
		df.Close()
	}
	return Ref{Sandbox: sandbox, Digest: "sha256:" + sum, Bytes: cw.n}, nil
}

// Open implements Store.
func (d Dir) Open(_ context.Context, ref Ref) (io.ReadCloser, error) {
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	dir, _ := d.dir(ref.Sandbox)
	f, err := os.Open(filepath.Join(dir, strings.TrimPrefix(ref.Digest, "sha256:")+".tar"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: bundle %s of sandbox %s is not in %s", errdefs.ErrNotFound, ref.Digest, ref.Sandbox, d.Root)
	}
	if err != nil {
		return nil, fmt.Errorf("bundle store %s: %w", d.Root, err)
	}
	return Verify(f, ref), nil
}

// Remove implements Store.
func (d Dir) Remove(_ context.Context, ref Ref) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	dir, _ := d.dir(ref.Sandbox)
	if err := os.Remove(filepath.Join(dir, strings.TrimPrefix(ref.Digest, "sha256:")+".tar")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	_ = os.Remove(dir) // if it is empty
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ErrCorrupt is a bundle whose bytes are not those its digest names.
var ErrCorrupt = fmt.Errorf("%w: the bundle's bytes do not match its digest (tampered with, or cut short)", errdefs.ErrFailedPrecondition)

// Verify wraps rc so that reading it to its end fails with ErrCorrupt
// unless exactly ref's bytes came through.
func Verify(rc io.ReadCloser, ref Ref) io.ReadCloser {
	return &verifier{rc: rc, h: sha256.New(), ref: ref}
}

type verifier struct {
	rc  io.ReadCloser
	h   hash.Hash
	n   int64
	ref Ref
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.ref.Bytes {
		return n, ErrCorrupt
	}
	if errors.Is(err, io.EOF) && (v.n != v.ref.Bytes || "sha256:"+hex.EncodeToString(v.h.Sum(nil)) != v.ref.Digest) {
		return n, ErrCorrupt
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }

// File is one file of a bundle: its name in the bundle and where its
// bytes are.
type File struct {
	Name string
	Path string
}

// Write writes files to w as a tar stream.
func Write(w io.Writer, files []File) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		if err := addFile(tw, f); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, f File) error {
	src, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("bundle: %s is not a regular file", f.Path)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Name, Size: fi.Size(), Mode: 0o600, ModTime: fi.ModTime()}); err != nil {
		return err
	}
	n, err := io.Copy(tw, src)
	if err == nil && n != fi.Size() {
		err = fmt.Errorf("bundle: %s changed while it was written", f.Path)
	}
	return err
}

// Limits says which files a bundle may hold and how large each may be;
// a name not in it is refused.
type Limits map[string]int64

// Extract writes the files of the tar stream r into dir (which must
// exist), each under its name, refusing anything Limits does not allow:
// another name, a second copy, a file over its size, a link, a device. It
// reads r to its end, so that a verifying reader (Verify) has its say;
// on an error the caller removes dir.
func Extract(r io.Reader, dir string, lim Limits) ([]string, error) {
	tr := tar.NewReader(r)
	var got []string
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return got, fmt.Errorf("bundle: %w", err)
		}
		max, ok := lim[h.Name]
		switch {
		case !ok:
			return got, fmt.Errorf("%w: bundle: unexpected entry %q", errdefs.ErrInvalid, h.Name)
		case seen[h.Name]:
			return got, fmt.Errorf("%w: bundle: %q twice", errdefs.ErrInvalid, h.Name)
		case h.Typeflag != tar.TypeReg:
			return got, fmt.Errorf("%w: bundle: %q is not a regular file", errdefs.ErrInvalid, h.Name)
		case h.Size < 0 || h.Size > max:
			return got, fmt.Errorf("%w: bundle: %q has %d bytes, over its limit of %d", errdefs.ErrInvalid, h.Name, h.Size, max)
		}
		seen[h.Name] = true
		// Names come from Limits (fixed by the caller), never from the
		// stream alone; they may name one subdirectory level.
		dst := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return got, err
		}
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return got, err
		}
		n, err := io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return got, fmt.Errorf("bundle: %s: %w", h.Name, err)
		}
		if n != h.Size {
			return got, fmt.Errorf("%w: bundle: %s is cut short", errdefs.ErrInvalid, h.Name)
		}
		got = append(got, h.Name)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return got, err
	}
	return got, nil
}
