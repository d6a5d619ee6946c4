package airlock

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// ArchiveResult is what WriteArchive made in a sandbox.
type ArchiveResult struct {
	Path    string `json:"path"`
	Entries int64  `json:"entries"` // files, directories, symlinks and hard links made
	Size    int64  `json:"size"`    // bytes of file data written
}

// WriteArchive extracts the tar stream r (uncompressed) into directory dir
// of sandbox id, made with its parents if missing, and returns what it
// made. r is read as the request is sent, never buffered whole; r is not
// closed. Entry names are relative to dir: the server refuses
// (ErrInvalid) absolute names, ".." components, writes through symlinks
// that lead outside dir, hard links to files the archive did not make,
// device nodes and FIFOs. Permission bits, symlinks, hard links and mtimes
// are kept; owners and setuid/setgid bits are not. An existing file is
// replaced, an existing directory merged into. An extraction that fails
// midway leaves what it made.
func (c *Client) WriteArchive(ctx context.Context, id, dir string, r io.Reader) (*ArchiveResult, error) {
	req, err := c.newRequest(ctx, http.MethodPut, sandboxPath(id, "files", "archive"), url.Values{"path": {dir}}, uploadBody(r))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out ArchiveResult
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("airlock: decode archive response: %w", err)
	}
	return &out, nil
}

// ReadArchive opens a tar stream of path in sandbox id: a file, or a
// directory and everything below it, with entries named base(path) and
// base(path)/... . Symlinks are archived as symlinks; sockets, FIFOs and
// devices are left out. The caller must close the body. If the server's
// stream breaks, reading fails: a short read is never a whole archive.
//
// The archive comes from the sandbox: extract it as hostile input
// (archive/tar through an os.Root, refusing absolute names, ".." and
// links that leave the destination, and capping its size), as
// `airlock cp -r` does.
func (c *Client) ReadArchive(ctx context.Context, id, path string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, sandboxPath(id, "files", "archive"), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-tar")
	resp, err := c.send(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
