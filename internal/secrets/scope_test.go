package secrets

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// scopedSecrets has API_KEY scoped to the X-Api-Key header of api.test;
// OTHER is unscoped.
var scopedSecrets = []Binding{
	{Name: "API_KEY", Hosts: []string{"api.test"}, Placeholder: ph1, Value: apiValue, Header: "X-Api-Key"},
	{Name: "OTHER", Hosts: []string{"other.test", "*.wild.test"}, Placeholder: ph2, Value: otherValue},
}

func TestInterceptHeaderScope(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, scopedSecrets, h.handle)
	g := h.connect(t, "api.test", nil)
	resp, body := g.do(t, "GET /echo HTTP/1.1\r\nHost: api.test\r\nx-api-key: "+ph1+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := h.seen()
	if len(got) != 1 || got[0].header.Get("X-Api-Key") != apiValue {
		t.Fatalf("upstream saw %+v", got)
	}
	evs := h.audit()
	if len(evs) != 1 || evs[0].Action != ActionInject || !slices.Equal(evs[0].Secrets, []string{"API_KEY"}) {
		t.Errorf("events = %+v", evs)
	}

	// Over HTTP/2 too.
	h2 := newH2Harness(t, scopedSecrets)
	g2 := h2.connectH2(t, "api.test")
	resp, body = g2.do(t, "GET", "https://api.test/echo", http.Header{"X-Api-Key": {ph1}}, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("h2: status %d: %s", resp.StatusCode, body)
	}
	if got := h2.seen(); len(got) != 1 || got[0].header.Get("X-Api-Key") != apiValue || got[0].proto != "HTTP/2.0" {
		t.Fatalf("h2: upstream saw %+v", got)
	}
}

func TestInterceptHeaderScopeRefusesElsewhere(t *testing.T) {
	t.Parallel()
	basic := base64.StdEncoding.EncodeToString([]byte("u:" + ph1))
	tests := map[string]string{
		"other header":   "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph1 + "\r\n\r\n",
		"both headers":   "GET / HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: " + ph1 + "\r\nX-Other: " + ph1 + "\r\n\r\n",
		"basic":          "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " + basic + "\r\n\r\n",
		"header name":    "GET / HTTP/1.1\r\nHost: api.test\r\nX-" + ph1 + ": 1\r\n\r\n",
		"query":          "GET /?k=" + ph1 + " HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"path":           "GET /" + ph1 + " HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"body":           fmt.Sprintf("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\nk=%s", len(ph1)+2, ph1),
		"chunked body":   fmt.Sprintf("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\nk=%s\r\n0\r\n\r\n", len(ph1)+2, ph1),
		"upper in query": "GET /?k=" + strings.ToUpper(ph1) + " HTTP/1.1\r\nHost: api.test\r\n\r\n",
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := &harness{}
			h.start(t, scopedSecrets, h.handle)
			g := h.connect(t, "api.test", nil)
			resp, body := g.do(t, raw)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("status %d: %s", resp.StatusCode, body)
			}
			if err := <-g.serve; !errors.Is(err, ErrRefused) {
				t.Errorf("Serve: %v, want ErrRefused", err)
			}
			g.serve <- nil
			if got := h.seen(); len(got) != 0 {
				t.Errorf("upstream saw %+v", got)
			}
			evs := h.audit()
			if len(evs) != 1 || evs[0].Action != ActionBlock || !slices.Equal(evs[0].Secrets, []string{"API_KEY"}) {
				t.Errorf("events = %+v", evs)
			}
		})
	}
	t.Run("h2", func(t *testing.T) {
		t.Parallel()
		h := newH2Harness(t, scopedSecrets)
		g := h.connectH2(t, "api.test")
		req, err := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+ph1)
		if resp, err := g.cc.RoundTrip(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("status %d", resp.StatusCode)
			}
		}
		if err := <-g.serve; !errors.Is(err, ErrRefused) {
			t.Errorf("Serve: %v, want ErrRefused", err)
		}
		g.serve <- nil
		if got := h.seen(); len(got) != 0 {
			t.Errorf("upstream saw %+v", got)
		}
	})
}

// An unscoped secret still goes anywhere in the request; a scoped one's
// placeholder toward another host is refused like any other.
func TestInterceptHeaderScopeOtherSecrets(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, scopedSecrets, h.handle)
	g := h.connect(t, "a.wild.test", nil)
	resp, body := g.do(t, "GET /?k="+ph2+" HTTP/1.1\r\nHost: a.wild.test\r\nAuthorization: Bearer "+ph2+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := h.seen(); len(got) != 1 || got[0].header.Get("Authorization") != "Bearer "+otherValue || got[0].uri != "/?k="+otherValue {
		t.Fatalf("upstream saw %+v", got)
	}
	resp, body = g.do(t, "GET / HTTP/1.1\r\nHost: a.wild.test\r\nX-Api-Key: "+ph1+"\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("API_KEY placeholder to a.wild.test: status %d: %s", resp.StatusCode, body)
	}
}

func TestValidScopeHeader(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"Authorization", "x-api-key", "X-Goog-Api-Key", "Cookie"} {
		if !ValidScopeHeader(ok) {
			t.Errorf("ValidScopeHeader(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", "Host", "content-length", "Transfer-Encoding", "TE", "Connection", "Upgrade", "X Key", "X-Key:", ":authority"} {
		if ValidScopeHeader(bad) {
			t.Errorf("ValidScopeHeader(%q) = true", bad)
		}
	}
	ic := &Interceptor{CA: &CA{}, Secrets: []Binding{{Name: "K", Hosts: []string{"a.test"}, Placeholder: ph1, Value: "v", Header: "Host"}}}
	if err := ic.validate(); err == nil {
		t.Error("a secret scoped to Host was accepted")
	}
}
