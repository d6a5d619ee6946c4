package api

import (
	"errors"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/guest"
)

// ioIdle is how long a client may stall an upload or download before the
// connection is dropped (rolling deadline per chunk).
const ioIdle = time.Minute

// filePath validates the path query parameter (contract: absolute, clean,
// no NUL, at most 4096 bytes).
func filePath(p string) (string, error) {
	switch {
	case p == "":
		return "", invalidf("path is required")
	case len(p) > 4096:
		return "", invalidf("path is longer than 4096 bytes")
	case strings.IndexByte(p, 0) >= 0:
		return "", invalidf("path contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return "", invalidf("path must be absolute")
	case path.Clean(p) != p:
		return "", invalidf("path must be clean (no ., .. or trailing /)")
	}
	return p, nil
}

// FileInfo is the API's view of a guest file.
type FileInfo struct {
	Path          string    `json:"path"`
	Name          string    `json:"name"`
	Type          string    `json:"type"`
	Size          uint64    `json:"size"`
	Mode          uint32    `json:"mode"`
	Mtime         time.Time `json:"mtime"`
	UID           uint32    `json:"uid"`
	GID           uint32    `json:"gid"`
	SymlinkTarget string    `json:"symlink_target"`
}

func viewFile(fi guest.FileInfo) FileInfo {
	t := "other"
	switch fi.Type {
	case guest.FileRegular:
		t = "file"
	case guest.FileDirectory:
		t = "dir"
	case guest.FileSymlink:
		t = "symlink"
	}
	return FileInfo{
		Path: fi.Path, Name: fi.Name, Type: t, Size: fi.Size, Mode: fi.Mode,
		Mtime: fi.Mtime.UTC(), UID: fi.UID, GID: fi.GID, SymlinkTarget: fi.SymlinkTarget,
	}
}

// sandboxAndPath resolves {id} (tenant-checked) and ?path=.
func (s *Server) sandboxAndPath(w http.ResponseWriter, r *http.Request) (id, p string, ok bool) {
	sb, err := s.sandbox(r)
	if err == nil {
		p, err = filePath(r.URL.Query().Get("path"))
	}
	if err != nil {
		s.fail(w, r, err)
		return "", "", false
	}
	return sb.ID, p, true
}

// IdleReader returns r (a request body of w's request) with a rolling
// read deadline set before each read, so a stalled client cannot hold an
// upload (and its guest stream) forever.
func IdleReader(r io.Reader, w http.ResponseWriter) io.Reader {
	return idleReader{r, http.NewResponseController(w)}
}

type idleReader struct {
	r  io.Reader
	rc *http.ResponseController
}

func (ir idleReader) Read(b []byte) (int, error) {
	_ = ir.rc.SetReadDeadline(time.Now().Add(ioIdle))
	return ir.r.Read(b)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			s.fail(w, r, invalidf("mode must be octal, at most 7777"))
			return
		}
	}
	// Streamed: no cap but the sandbox's disk, one chunk in memory.
	n, err := s.cfg.Files.WriteFile(r.Context(), callerOf(r), id, p, uint32(mode), IdleReader(r.Body, w))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "size": n})
}

// LazyWriter sends the 200 header with the first byte (Content-Type
// application/octet-stream unless set), so that an error before any data
// can still be answered as JSON; each write has a rolling deadline.
type LazyWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

// NewLazyWriter returns a LazyWriter over w.
func NewLazyWriter(w http.ResponseWriter) *LazyWriter {
	return &LazyWriter{w: w, rc: http.NewResponseController(w)}
}

// Started reports whether the header has been sent.
func (lw *LazyWriter) Started() bool { return lw.started }

func (lw *LazyWriter) Write(b []byte) (int, error) {
	if !lw.started {
		lw.start()
	}
	_ = lw.rc.SetWriteDeadline(time.Now().Add(ioIdle))
	return lw.w.Write(b)
}

// Finish sends the header if no byte did (an empty file).
func (lw *LazyWriter) Finish() {
	if !lw.started {
		lw.start()
	}
}

func (lw *LazyWriter) start() {
	lw.started = true
	if lw.w.Header().Get("Content-Type") == "" {
		lw.w.Header().Set("Content-Type", "application/octet-stream")
	}
	lw.w.WriteHeader(http.StatusOK)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	lw := NewLazyWriter(w)
	_, err := s.cfg.Files.ReadFile(r.Context(), callerOf(r), id, p, lw, func(fi guest.FileInfo) {
		if !lw.started && fi.Type == guest.FileRegular {
			w.Header().Set("Content-Length", strconv.FormatUint(fi.Size, 10))
		}
	})
	switch {
	case err == nil:
		lw.Finish()
	case !lw.started:
		w.Header().Del("Content-Length")
		s.fail(w, r, err)
	default:
		// Mid-stream: the status is sent; break the connection so the
		// client sees a truncated body, not a short file.
		s.log.Warn("download broken", "request_id", requestID(r), "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Files.RemoveFile(r.Context(), callerOf(r), id, p, r.URL.Query().Get("recursive") == "true"); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	depth := uint64(1)
	if d := r.URL.Query().Get("depth"); d != "" {
		var err error
		if depth, err = strconv.ParseUint(d, 10, 8); err != nil || depth < 1 || depth > 16 {
			s.fail(w, r, invalidf("depth must be between 1 and 16"))
			return
		}
	}
	ls, err := s.cfg.Files.ListFiles(r.Context(), callerOf(r), id, p, uint32(depth))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]FileInfo, 0, len(ls.Entries))
	for _, e := range ls.Entries {
		out = append(out, viewFile(e))
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out, "truncated": ls.Truncated})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	fi, err := s.cfg.Files.StatFile(r.Context(), callerOf(r), id, p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewFile(fi))
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req struct {
		Path    string `json:"path"`
		Parents bool   `json:"parents"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := filePath(req.Path)
	if err == nil {
		err = s.cfg.Files.Mkdir(r.Context(), callerOf(r), sb.ID, p, req.Parents)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// renameFile renames or moves a guest file or directory (rename(2) in the
// guest: one filesystem).
func (s *Server) renameFile(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	from, err := namedPath("from", req.From)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	to, err := namedPath("to", req.To)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if from == "/" || to == "/" {
		s.fail(w, r, invalidf("the root directory cannot be renamed"))
		return
	}
	if err := s.cfg.Files.Rename(r.Context(), callerOf(r), sb.ID, from, to); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// namedPath is filePath for a JSON field other than path: its errors name
// the field ("to must be absolute").
func namedPath(field, p string) (string, error) {
	p, err := filePath(p)
	if e, ok := errors.AsType[*Error](err); ok {
		return "", invalidf("%s%s", field, strings.TrimPrefix(e.Message, "path"))
	}
	return p, err
}
