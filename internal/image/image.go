package image

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Errors. Match them with errors.Is; the first two are the errdefs
// categories themselves, ErrLimit also matches
// errdefs.ErrResourceExhausted.
var (
	// ErrNotFound: no image has that name.
	ErrNotFound = errdefs.ErrNotFound
	// ErrInvalid: a bad name or reference, or an archive or image that is
	// malformed, fails verification, or tries to escape its root.
	ErrInvalid = errdefs.ErrInvalid
	// ErrLimit: an image exceeds Limits (size or entry count).
	ErrLimit error = &categorized{"image limit exceeded", errdefs.ErrResourceExhausted}
	// ErrCorrupt: a stored blob no longer matches its digest.
	ErrCorrupt = errors.New("image blob corrupt")
)

// categorized is a sentinel error that also matches a category.
type categorized struct {
	msg string
	cat error
}

func (e *categorized) Error() string { return e.msg }
func (e *categorized) Unwrap() error { return e.cat }

// Image is a named, read-only root filesystem image.
type Image struct {
	// Name is the image's name, unique within a Store (see ValidName).
	Name string
	// Digest is "sha256:<hex>" of the ext4 file.
	Digest string
	// Size is the ext4 file's size in bytes.
	Size int64
	// Created is when the image was built.
	Created time.Time
	// Source says where it came from: "mmdebstrap:bookworm+r2" (BaseSource),
	// "import:<tarball base name>" or "pull:<ref>@<manifest digest>".
	Source string
}

// Index maps image names to images. The daemon backs it with its catalog.
// Implementations must be safe for concurrent use.
type Index interface {
	// PutImage records img under img.Name, replacing any image of that name.
	PutImage(ctx context.Context, img Image) error
	// GetImage returns the image called name, or an error wrapping
	// ErrNotFound.
	GetImage(ctx context.Context, name string) (Image, error)
	// ListImages returns every image, in any order.
	ListImages(ctx context.Context) ([]Image, error)
	// DeleteImage removes the name, or returns an error wrapping
	// ErrNotFound. It does not touch blobs.
	DeleteImage(ctx context.Context, name string) error
}

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

// ValidName returns nil if name can name an image: 1 to 64 characters from
// [a-z0-9._-], starting with a letter or digit. Otherwise the error wraps
// ErrInvalid.
func ValidName(name string) error {
	if !nameRE().MatchString(name) {
		return fmt.Errorf("image name %q: %w: use 1-64 characters a-z 0-9 . _ - starting with a letter or digit", name, ErrInvalid)
	}
	return nil
}

// DefaultName derives an image name from a registry reference: the last
// path component of the repository, "-", and the tag (or the first 12
// hex digits of the digest), lower-cased with other characters replaced
// by '-'. "docker.io/library/python:3.12-slim" gives "python-3.12-slim".
func DefaultName(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("reference %q: %w: %v", ref, ErrInvalid, err)
	}
	return defaultName(r)
}

func defaultName(r name.Reference) (string, error) {
	repo := r.Context().RepositoryStr()
	if i := strings.LastIndex(repo, "/"); i >= 0 {
		repo = repo[i+1:]
	}
	suffix := r.Identifier()
	if d, ok := r.(name.Digest); ok {
		_, hex, _ := strings.Cut(d.DigestStr(), ":")
		suffix = hex[:min(12, len(hex))]
	}
	n := sanitizeName(repo + "-" + suffix)
	if err := ValidName(n); err != nil {
		return "", fmt.Errorf("no default name for %q: %w", r.String(), err)
	}
	return n, nil
}

// sanitizeName maps s onto the name alphabet.
func sanitizeName(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	out := strings.TrimLeft(string(b), "._-")
	if len(out) > 64 {
		out = out[:64]
	}
	return out
}

var digestRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^sha256:[0-9a-f]{64}$`) })

// validDigest reports whether d is "sha256:" and 64 lower-case hex digits.
func validDigest(d string) bool { return digestRE().MatchString(d) }
