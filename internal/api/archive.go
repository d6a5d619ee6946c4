package api

import (
	"net/http"
	"strings"
)

// Directories as tar streams: PUT extracts a tar into a guest directory,
// GET returns a tar of a guest file or directory tree. Nothing is buffered
// whole, and nothing is compressed (no decompression bombs): the guest
// extracts with the defences of internal/archive, and what it sends back
// is capped at sandbox.ArchiveLimit of its disk.

// The two routes join the route table here rather than in server.go's
// literal (which others were editing when they were added); they belong
// there.
// writeArchive extracts the body, a tar stream, into ?path= (made if
// missing).
func (s *Server) writeArchive(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		s.fail(w, r, invalidf("the archive must not be compressed (Content-Encoding %q)", enc))
		return
	}
	res, err := s.cfg.Files.WriteArchive(r.Context(), callerOf(r), id, p, IdleReader(r.Body, w))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "entries": res.Entries, "size": res.Bytes})
}

// readArchive streams a tar of ?path=: entries named base(path) and
// base(path)/... .
func (s *Server) readArchive(w http.ResponseWriter, r *http.Request) {
	id, p, ok := s.sandboxAndPath(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	lw := NewLazyWriter(w)
	_, err := s.cfg.Files.ReadArchive(r.Context(), callerOf(r), id, p, lw)
	switch {
	case err == nil:
		lw.Finish()
	case !lw.Started():
		w.Header().Del("Content-Type")
		s.fail(w, r, err)
	default:
		// Mid-stream: the status is sent; break the connection so the
		// client sees a truncated body, not a short archive.
		s.log.Warn("archive download broken", "request_id", requestID(r), "err", err)
		panic(http.ErrAbortHandler)
	}
}
