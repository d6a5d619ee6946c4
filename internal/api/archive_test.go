package api

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/archive"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// WriteArchive keeps the archive's regular files in the fake's files, as
// the guest would (names checked with archive.CleanName).
func (f *fake) WriteArchive(_ context.Context, c sandbox.Caller, id, p string, r io.Reader) (guest.ArchiveResult, error) {
	if _, err := f.lookup(c, id); err != nil {
		return guest.ArchiveResult{}, err
	}
	var res guest.ArchiveResult
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
		}
		name, err := archive.CleanName(h.Name)
		if err != nil {
			return res, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
		}
		res.Entries++
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return res, err
			}
			f.mu.Lock()
			f.files[id+path.Join(p, name)] = b
			f.mu.Unlock()
			res.Bytes += int64(len(b))
		}
	}
	f.audit(c, id, "file.extract", map[string]any{"path": p, "entries": res.Entries, "size": res.Bytes})
	return res, nil
}

// ReadArchive sends the fake's files under p as a tar; "/broken" fails
// after the first bytes.
func (f *fake) ReadArchive(_ context.Context, c sandbox.Caller, id, p string, w io.Writer) (int64, error) {
	if _, err := f.lookup(c, id); err != nil {
		return 0, err
	}
	f.mu.Lock()
	var names []string
	for k := range f.files {
		if rest, ok := strings.CutPrefix(k, id+p+"/"); ok {
			names = append(names, rest)
		}
	}
	slices.Sort(names)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, n := range names {
		data := f.files[id+p+"/"+n]
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path.Base(p) + "/" + n, Mode: 0o644, Size: int64(len(data))})
		_, _ = tw.Write(data)
	}
	f.mu.Unlock()
	_ = tw.Close()
	if len(names) == 0 && p != "/broken" {
		return 0, fmt.Errorf("%w: archive %s: no such file", errdefs.ErrNotFound, p)
	}
	if p == "/broken" {
		if _, err := w.Write(make([]byte, 1024)); err != nil {
			return 0, err
		}
		return 1024, fmt.Errorf("%w: the guest went away", errdefs.ErrUnavailable)
	}
	return io.Copy(w, &b)
}

func TestArchiveRoutes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	for name, body := range map[string]string{"./a.txt": "alpha", "./sub/b.txt": "beta"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(body))
	}
	_ = tw.Close()

	r := h.do(h.alice, "PUT", "/v1/sandboxes/aliceaaaaaaa/files/archive?path=/srv/app", bytes.NewReader(in.Bytes()))
	var res struct {
		Path    string `json:"path"`
		Entries int    `json:"entries"`
		Size    int    `json:"size"`
	}
	if r.code != 200 || json.Unmarshal(r.body, &res) != nil || res != struct {
		Path    string `json:"path"`
		Entries int    `json:"entries"`
		Size    int    `json:"size"`
	}{"/srv/app", 2, 9} {
		t.Fatalf("put: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files?path=/srv/app/sub/b.txt", nil); r.code != 200 || string(r.body) != "beta" {
		t.Fatalf("the extracted file: %d %q", r.code, r.body)
	}

	r = h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files/archive?path=/srv/app", nil)
	if r.code != 200 || r.hdr.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("get: %d %s %q", r.code, r.hdr.Get("Content-Type"), r.body)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(r.body))
	for {
		hd, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hd.Name)
	}
	if !slices.Equal(names, []string{"app/a.txt", "app/sub/b.txt"}) {
		t.Fatalf("archive names %v", names)
	}

	// Refused before the manager: bad paths, a compressed body; by the
	// guest (here the fake): an escaping name.
	for _, p := range []string{"", "rel", "/a/../b"} {
		if r := h.do(h.alice, "PUT", "/v1/sandboxes/aliceaaaaaaa/files/archive?path="+p, bytes.NewReader(in.Bytes())); r.code != 400 {
			t.Errorf("put path %q: %d", p, r.code)
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), "PUT", h.url+"/v1/sandboxes/aliceaaaaaaa/files/archive?path=/x", bytes.NewReader(in.Bytes()))
	req.Header.Set("Authorization", "Bearer "+h.alice)
	req.Header.Set("Content-Encoding", "gzip")
	if res, err := http.DefaultTransport.RoundTrip(req); err != nil || res.StatusCode != 400 {
		t.Errorf("gzip body: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	var evil bytes.Buffer
	tw = tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "../escape", Mode: 0o600})
	_ = tw.Close()
	if r := h.do(h.alice, "PUT", "/v1/sandboxes/aliceaaaaaaa/files/archive?path=/x", &evil); r.code != 400 || r.err(t).Error.Code != "invalid" {
		t.Errorf("escaping name: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files/archive?path=/nope", nil); r.code != 404 || r.err(t).Error.Code != "not_found" {
		t.Errorf("missing path: %d %s", r.code, r.body)
	}
	// Another tenant's sandbox is absent.
	if r := h.do(h.bob, "GET", "/v1/sandboxes/aliceaaaaaaa/files/archive?path=/srv/app", nil); r.code != 404 {
		t.Errorf("bob reads alice's archive: %d", r.code)
	}
	// An error after the first bytes cuts the connection: the client must
	// not take the body for a whole archive.
	req, _ = http.NewRequestWithContext(t.Context(), "GET", h.url+"/v1/sandboxes/aliceaaaaaaa/files/archive?path=/broken", nil)
	req.Header.Set("Authorization", "Bearer "+h.alice)
	// (The 200 may still sit in the server's buffer when the connection is
	// cut: then the round trip itself fails.)
	if res2, err := http.DefaultTransport.RoundTrip(req); err == nil {
		_, err = io.ReadAll(res2.Body)
		res2.Body.Close()
		if err == nil {
			t.Errorf("broken stream: %d and a clean body; want a cut connection", res2.StatusCode)
		}
	}

	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: "aliceaaaaaaa", Type: "file"})
	if err != nil || len(evs) == 0 || evs[0].Action != "file.extract" || evs[0].Detail["entries"] != float64(2) {
		t.Errorf("events %v %v", evs, err)
	}
}
