package api

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestHostPreview: with a preview domain, a port is served at its own
// host to an API key of the sandbox's tenant or to the sandbox's preview
// token (header, cookie, or query, which becomes the cookie); nothing of
// either reaches the guest; anything else is 401.
func TestHostPreview(t *testing.T) {
	t.Parallel()
	f, st := newFakeOnCatalog(t)
	_, alice, _ := st.CreateKey(t.Context(), store.APIKey{Tenant: "alice"})
	_, bob, _ := st.CreateKey(t.Context(), store.APIKey{Tenant: "bob"})
	const id = "aliceaaaaaaaaaaaaaaa"
	f.add(id, "alice")
	s, err := New(Config{Sandboxes: f, Files: f, Execs: f, Ports: f, Events: st, Keys: st, Log: slog.New(slog.DiscardHandler),
		PreviewDomain: "preview.test:7070", Secret: []byte(strings.Repeat("k", 32))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	f.serveGuest(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"path": r.URL.RequestURI(), "host": r.Host, "header": r.Header})
	}))

	tok := s.PreviewToken(id)
	get := func(host, path string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+path, nil)
		req.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	host := "8000-" + id + ".preview.test:7070"
	for name, hdr := range map[string][]string{
		"alice's key":        {"Authorization", "Bearer " + alice},
		"the token header":   {"X-Airlock-Preview-Token", tok},
		"E2B's token header": {"E2B-Traffic-Access-Token", tok},
		"the token cookie":   {"Cookie", PreviewTokenParam + "=" + tok + "; keep=1"},
	} {
		res, body := get(host, "/app/x?q=1", hdr...)
		if res.StatusCode != 200 || !strings.Contains(body, `"path":"/app/x?q=1"`) || !strings.Contains(body, `"host":"localhost:8000"`) {
			t.Errorf("%s: %d %s", name, res.StatusCode, body)
		}
		if strings.Contains(body, tok) || strings.Contains(body, alice) {
			t.Errorf("%s: a credential reached the guest: %s", name, body)
		}
	}
	// The token in the query becomes a cookie, and the URL loses it.
	res, _ := get(host, "/app?"+PreviewTokenParam+"="+tok+"&q=1")
	if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/app?q=1" || !strings.Contains(res.Header.Get("Set-Cookie"), PreviewTokenParam+"="+tok) || !strings.Contains(res.Header.Get("Set-Cookie"), "HttpOnly") {
		t.Fatalf("query token: %d %v", res.StatusCode, res.Header)
	}
	// A WebSocket handshake cannot follow a redirect: with the token in
	// its query it goes to the guest (noVNC's path carries it), without it.
	res, body := get(host, "/websockify?"+PreviewTokenParam+"="+tok, "Upgrade", "websocket", "Connection", "Upgrade")
	if res.StatusCode == http.StatusFound || res.StatusCode == http.StatusUnauthorized || strings.Contains(body, tok) {
		t.Errorf("a WebSocket handshake with the token in its query: %d %s", res.StatusCode, body)
	}
	for name, hdr := range map[string][]string{
		"nothing":                  nil,
		"bob's key":                {"Authorization", "Bearer " + bob},
		"a wrong token":            {"X-Airlock-Preview-Token", "x"},
		"another sandbox's token":  {"X-Airlock-Preview-Token", s.PreviewToken("bobbbbbbbbbbbbbbbbbb")},
		"the token for a cookie's": {"Cookie", PreviewTokenParam + "=" + strings.ToUpper(tok)},
	} {
		res, body := get(host, "/", hdr...)
		want := http.StatusUnauthorized
		if name == "bob's key" {
			want = http.StatusNotFound // bob's key is valid; the sandbox is not his
		}
		if res.StatusCode != want {
			t.Errorf("%s: %d %s", name, res.StatusCode, body)
		}
	}
	// Hosts that are not preview hosts go to the API as usual.
	if res, _ := get("api.preview.test:7070", "/healthz"); res.StatusCode != 200 {
		t.Errorf("API host: %d", res.StatusCode)
	}
	if res, _ := get("8000-NOTANID.preview.test", "/healthz"); res.StatusCode != 200 {
		t.Errorf("a malformed preview host: %d", res.StatusCode)
	}
	// The link route.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+"/v1/sandboxes/"+id+"/preview?port=8000", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	lres, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer lres.Body.Close()
	var link struct{ URL, Host, Token string }
	_ = json.NewDecoder(lres.Body).Decode(&link)
	u, _ := url.Parse(link.URL)
	if lres.StatusCode != 200 || link.Token != tok || u == nil || u.Host != host || u.Query().Get(PreviewTokenParam) != tok || link.Host != host {
		t.Fatalf("preview link: %d %+v", lres.StatusCode, link)
	}
}
