package airlock

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Paths in a sandbox must be absolute and clean, without NUL, at most 4096
// bytes; the server answers anything else with ErrInvalid.

// FileInfo describes one path in a sandbox.
type FileInfo struct {
	Path          string      `json:"path"`
	Name          string      `json:"name"`
	Type          string      `json:"type"` // "file", "dir", "symlink" or "other"
	Size          int64       `json:"size"`
	Mode          fs.FileMode `json:"-"` // permission bits (and setuid/setgid/sticky as the server sends them)
	MTime         time.Time   `json:"mtime"`
	UID           int         `json:"uid"`
	GID           int         `json:"gid"`
	SymlinkTarget string      `json:"symlink_target"`
}

// UnmarshalJSON decodes the wire form; "mode" may be a number or an octal
// string such as "0644".
func (fi *FileInfo) UnmarshalJSON(b []byte) error {
	type plain FileInfo
	var w struct {
		plain
		Mode json.RawMessage `json:"mode"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*fi = FileInfo(w.plain)
	if len(w.Mode) == 0 || string(w.Mode) == "null" {
		return nil
	}
	var n uint32
	if err := json.Unmarshal(w.Mode, &n); err != nil {
		var s string
		if json.Unmarshal(w.Mode, &s) != nil {
			return fmt.Errorf("bad file mode %s", w.Mode)
		}
		v, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
		if err != nil {
			return fmt.Errorf("bad file mode %q", s)
		}
		n = uint32(v)
	}
	fi.Mode = fs.FileMode(n)
	return nil
}

// IsDir reports whether fi is a directory.
func (fi *FileInfo) IsDir() bool { return fi.Type == "dir" }

// WriteFile streams r into path in sandbox id, replacing the file, and
// returns the size the server stored. r is read as the request is sent, never
// buffered whole; r is not closed. Bytes, strings and bytes.Buffer readers are
// sent with a Content-Length, anything else chunked.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader) (int64, error) {
	return c.writeFile(ctx, id, path, r, "")
}

// WriteFileMode is WriteFile that also sets the file's permission bits.
func (c *Client) WriteFileMode(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	return c.writeFile(ctx, id, path, r, fmt.Sprintf("%04o", uint32(mode.Perm())))
}

func (c *Client) writeFile(ctx context.Context, id, path string, r io.Reader, mode string) (int64, error) {
	q := url.Values{"path": {path}}
	if mode != "" {
		q.Set("mode", mode)
	}
	req, err := c.newRequest(ctx, http.MethodPut, sandboxPath(id, "files"), q, uploadBody(r))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req, http.StatusOK, http.StatusCreated)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("airlock: decode write response: %w", err)
	}
	return out.Size, nil
}

// uploadBody makes r a request body that is streamed, never closed.
func uploadBody(r io.Reader) io.Reader {
	switch r.(type) {
	case *bytes.Reader, *bytes.Buffer, *strings.Reader:
		return r // net/http sets Content-Length and does not close these
	case nil:
		return http.NoBody
	default:
		// Hide Close (the transport would close the caller's file) and any
		// size hints; the body goes out chunked, read as it is sent.
		return struct{ io.Reader }{r}
	}
}

// ReadFile opens path in sandbox id for streaming. The caller must close the
// returned body; reading it fails if ctx ends.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, sandboxPath(id, "files"), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/octet-stream")
	resp, err := c.send(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// FileList is the answer of ListFiles.
type FileList struct {
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"` // the server capped the listing
}

// ListFiles lists directory path in sandbox id, descending depth levels
// (0 = the server's default, 1).
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) (*FileList, error) {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var out FileList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "files", "list"), q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// Stat describes path in sandbox id (ErrNotFound if it does not exist).
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	var out FileInfo
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "files", "stat"), url.Values{"path": {path}}, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// Mkdir creates directory path in sandbox id, and its missing parents if
// parents is set.
func (c *Client) Mkdir(ctx context.Context, id, path string, parents bool) error {
	in := struct {
		Path    string `json:"path"`
		Parents bool   `json:"parents"`
	}{path, parents}
	return c.doJSON(ctx, http.MethodPost, sandboxPath(id, "files", "mkdir"), nil, in, nil, http.StatusNoContent, http.StatusOK)
}

// Rename renames or moves from to to within sandbox id's filesystem
// (rename(2) in the guest: an existing file at to is replaced; across
// filesystems it is refused).
func (c *Client) Rename(ctx context.Context, id, from, to string) error {
	in := struct {
		From string `json:"from"`
		To   string `json:"to"`
	}{from, to}
	return c.doJSON(ctx, http.MethodPost, sandboxPath(id, "files", "rename"), nil, in, nil, http.StatusNoContent, http.StatusOK)
}

// Remove deletes path in sandbox id; a directory that is not empty needs
// recursive.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "files"), q, nil, nil, http.StatusNoContent, http.StatusOK)
}
