package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 1000

// fileAuth admits a /files request that carries the sandbox's access token
// or a valid signature for op ("read" or "write"), and answers 401 if not.
func (h *handler) fileAuth(w http.ResponseWriter, r *http.Request, op string) (target, string, bool) {
	t, ok := targetOf(r.Context())
	if ok {
		if tok := r.Header.Get("X-Access-Token"); tok != "" {
			ok = h.tokenOK(t.id, tok)
		} else {
			ok = h.signatureOK(t.id, r, op)
		}
	}
	if !ok {
		writeError(w, http.StatusUnauthorized, "missing or invalid access token or signature")
		return t, "", false
	}
	user, err := userOf(r.URL.Query().Get("username"))
	if err != nil {
		h.fileFail(w, r, err)
		return t, "", false
	}
	return t, user, true
}

// download serves GET /files?path=: the file's bytes, typed by its
// extension, or a JSON error (404 for a missing file, 400 for a
// directory).
func (h *handler) download(w http.ResponseWriter, r *http.Request) {
	t, user, ok := h.fileAuth(w, r, "read")
	if !ok {
		return
	}
	p, err := guestPath(r.URL.Query().Get("path"), user)
	if err != nil {
		h.fileFail(w, r, err)
		return
	}
	fi, err := h.cfg.Files.StatFile(r.Context(), t.c, t.id, p)
	if err == nil && fi.Type == guest.FileDirectory {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q is a directory", p))
		return
	}
	if err != nil {
		h.fileFail(w, r, err)
		return
	}
	ct := mime.TypeByExtension(path.Ext(p))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	lw := api.NewLazyWriter(w)
	_, err = h.cfg.Files.ReadFile(r.Context(), t.c, t.id, p, lw, func(fi guest.FileInfo) {
		if !lw.Started() && fi.Type == guest.FileRegular {
			w.Header().Set("Content-Length", strconv.FormatUint(fi.Size, 10))
		}
	})
	switch {
	case err == nil:
		lw.Finish()
	case !lw.Started():
		w.Header().Del("Content-Length")
		w.Header().Del("Content-Disposition")
		h.fileFail(w, r, err)
	default:
		h.cfg.Log.Warn("e2b download broken", "sandbox_id", t.id, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// written is one entry of an upload's answer.
type written struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload serves POST /files: a multipart body (one part per file, each
// named by its filename, a full path; the path query, if set, names the
// only file) or a raw body for the path query, gzip-encoded or not. Each
// file streams to the guest; parents are made; files are overwritten.
func (h *handler) upload(w http.ResponseWriter, r *http.Request) {
	t, user, ok := h.fileAuth(w, r, "write")
	if !ok {
		return
	}
	body := io.Reader(r.Body)
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		if enc != "gzip" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("Content-Encoding %q: only gzip is accepted", enc))
			return
		}
		zr, err := gzip.NewReader(api.IdleReader(r.Body, w))
		if err != nil {
			writeError(w, http.StatusBadRequest, "the gzip body is not gzip: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	} else {
		body = api.IdleReader(body, w)
	}
	queryPath := r.URL.Query().Get("path")
	put := func(name string, data io.Reader) (written, error) {
		p, err := guestPath(name, user)
		if err != nil {
			return written{}, err
		}
		if _, err := h.cfg.Files.WriteFile(r.Context(), t.c, t.id, p, 0o644, data); err != nil {
			return written{}, err
		}
		return written{Path: p, Name: path.Base(p), Type: "file"}, nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		if queryPath == "" {
			writeError(w, http.StatusBadRequest, "path is required for a body that is not multipart/form-data")
			return
		}
		e, err := put(queryPath, body)
		if err != nil {
			h.fileFail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, []written{e})
		return
	}
	if params["boundary"] == "" {
		writeError(w, http.StatusBadRequest, "multipart/form-data without a boundary")
		return
	}
	mr := multipart.NewReader(body, params["boundary"])
	out := []written{}
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		// The filename is the file's full path; Part.FileName would keep
		// only its last element, so read the header's parameter whole.
		_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		name := dp["filename"]
		if queryPath != "" {
			if len(out) > 0 {
				writeError(w, http.StatusBadRequest, "the path query names one file; send several without it, each named by its filename")
				return
			}
			name = queryPath
		}
		if len(out) == maxUploadParts {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("more than %d files in one upload", maxUploadParts))
			return
		}
		e, err := put(name, part)
		part.Close()
		if err != nil {
			h.fileFail(w, r, err)
			return
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, `no file in the upload (parts named "file")`)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// fileFail answers a /files error in envd's JSON shape: 404 for a missing
// file (the SDK's FileNotFoundError), 507 for a full disk.
func (h *handler) fileFail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, sandbox.ErrNoSandbox) {
		// Gone since the request came in: what E2B's proxy says.
		writeJSON(w, http.StatusBadGateway, map[string]any{"message": "The sandbox was not found", "code": http.StatusBadGateway})
		return
	}
	status, _, msg := api.PublicError(err)
	if status >= 500 && status != http.StatusInsufficientStorage {
		h.cfg.Log.Error("e2b files request failed", "method", r.Method, "err", err)
	}
	if status == http.StatusNotFound {
		msg = "file not found: " + r.URL.Query().Get("path")
	}
	writeError(w, status, msg)
}
