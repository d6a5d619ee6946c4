package airlock_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// archiveServer serves the two archive routes: PUT keeps the body (and
// checks the request's form), GET sends it back; a path of /broken cuts
// the stream after the first bytes, /nope is a 404.
type archiveServer struct {
	mu   sync.Mutex
	body []byte
	req  *http.Request
}

func (a *archiveServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.req = r.Clone(r.Context())
	if r.URL.Path != "/v1/sandboxes/sb1/files/archive" {
		http.NotFound(w, r)
		return
	}
	p := r.URL.Query().Get("path")
	switch {
	case p == "/nope":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		_, _ = io.WriteString(w, `{"error":{"code":"not_found","message":"no such file","request_id":"r1"}}`)
	case r.Method == http.MethodPut:
		a.body, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"path": p, "entries": 3, "size": len(a.body)})
	case p == "/broken":
		w.Header().Set("Content-Type", "application/x-tar")
		_, _ = w.Write(make([]byte, 512))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	default:
		w.Header().Set("Content-Type", "application/x-tar")
		_, _ = w.Write(a.body)
	}
}

func TestArchives(t *testing.T) {
	t.Parallel()
	a := &archiveServer{}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	c := airlock.New(srv.URL, "k")
	ctx := t.Context()

	tarBytes := bytes.Repeat([]byte("t"), 2048)
	res, err := c.WriteArchive(ctx, "sb1", "/srv/app", struct{ io.Reader }{bytes.NewReader(tarBytes)})
	if err != nil || res.Path != "/srv/app" || res.Entries != 3 || res.Size != 2048 {
		t.Fatalf("WriteArchive = %+v, %v", res, err)
	}
	if ct := a.req.Header.Get("Content-Type"); ct != "application/x-tar" {
		t.Errorf("content type %q", ct)
	}
	if te := a.req.TransferEncoding; len(te) != 1 || te[0] != "chunked" {
		t.Errorf("transfer encoding %v, want chunked (streamed)", te)
	}
	rc, err := c.ReadArchive(ctx, "sb1", "/srv/app")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, tarBytes) {
		t.Fatalf("ReadArchive: %d bytes, %v", len(got), err)
	}
	if q := a.req.URL.Query().Get("path"); q != "/srv/app" {
		t.Errorf("path %q", q)
	}
	if _, err := c.ReadArchive(ctx, "sb1", "/nope"); !errors.Is(err, airlock.ErrNotFound) {
		t.Errorf("missing path: %v", err)
	}
	// A stream cut midway is an error, never a short archive.
	rc, err = c.ReadArchive(ctx, "sb1", "/broken")
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if err == nil || strings.Contains(err.Error(), "not_found") {
		t.Errorf("broken stream: %v, want a read error", err)
	}
}
