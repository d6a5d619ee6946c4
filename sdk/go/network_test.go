package airlock_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func TestCreateNetwork(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{Network: &airlock.Network{
		Mode:      airlock.NetworkDeny,
		Allow:     []string{"api.github.com", "140.82.112.0/20:443"},
		Secrets:   []airlock.Secret{{Name: "OPENAI_API_KEY", Hosts: []string{"api.openai.com"}, Value: "sk-test"}},
		RateBytes: 1 << 20, MaxConns: 64,
	}})
	if err != nil {
		t.Fatal(err)
	}
	n := sb.Network
	if n.Mode != "deny" || len(n.Allow) != 2 || n.RateBytes != 1<<20 || n.MaxConns != 64 || len(n.Secrets) != 1 ||
		n.Secrets[0].Name != "OPENAI_API_KEY" || n.Secrets[0].Value != "" || !strings.HasPrefix(n.Secrets[0].Placeholder, "airlock-secret-") {
		t.Errorf("network %+v", n)
	}
	// The default sends no "network" at all; a mode alone sends only it.
	for _, tc := range []struct {
		net  *airlock.Network
		want string
	}{
		{nil, ""},
		{&airlock.Network{Mode: airlock.NetworkNone}, `{"mode":"none"}`},
	} {
		c2 := airlock.New(f.srv.URL, f.key, airlock.WithHTTPClient(&http.Client{Transport: recordBody(func(b []byte) {
			var m map[string]json.RawMessage
			_ = json.Unmarshal(b, &m)
			if got := string(m["network"]); got != tc.want {
				t.Errorf("network sent %q, want %q", got, tc.want)
			}
		})}))
		if _, err := c2.Create(ctx, airlock.CreateOptions{Network: tc.net}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.Create(ctx, airlock.CreateOptions{Network: &airlock.Network{Ports: []airlock.Port{{HostPort: 8080, GuestPort: 8000}}}})
	if !errors.Is(err, airlock.ErrPermissionDenied) {
		t.Errorf("ports as a tenant: %v", err)
	}
	_, err = c.Create(ctx, airlock.CreateOptions{Network: &airlock.Network{Secrets: []airlock.Secret{{Name: "K", Hosts: []string{"a.example"}}}}})
	if !errors.Is(err, airlock.ErrInvalid) {
		t.Errorf("secret without a value: %v", err)
	}
}

// recordBody is a RoundTripper that shows each request body to fn.
type recordBody func([]byte)

func (fn recordBody) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		fn(b)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestEventsType(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, _ := c.Create(ctx, airlock.CreateOptions{})
	f.mu.Lock()
	f.event(sb.ID, "net.deny", map[string]any{"host": "example.org"})
	f.event(sb.ID, "net.secret.inject", map[string]any{"name": "K"})
	f.mu.Unlock()
	evs, _, err := c.Events(ctx, airlock.EventsOptions{Sandbox: sb.ID, Type: "net"})
	if err != nil || len(evs) != 2 || evs[0].Action != "net.deny" || evs[1].Action != "net.secret.inject" {
		t.Fatalf("Events(type=net) = %+v, %v", evs, err)
	}
	if q := f.lastRequest().URL.Query(); q.Get("type") != "net" || q.Get("sandbox") != sb.ID {
		t.Errorf("query %v", q)
	}
}

func TestPortURL(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, _ := c.Create(ctx, airlock.CreateOptions{})
	if got, want := c.PortURL(sb.ID, 8000), f.srv.URL+"/v1/sandboxes/"+sb.ID+"/ports/8000/"; got != want {
		t.Errorf("PortURL = %q, want %q", got, want)
	}
	req, err := c.PortRequest(ctx, "POST", sb.ID, 8000, "/api/items?x=1", strings.NewReader("hi"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got map[string]string
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || res.StatusCode != 200 {
		t.Fatalf("%d %v", res.StatusCode, err)
	}
	if got["port"] != "8000" || got["path"] != "api/items" || got["query"] != "x=1" || got["method"] != "POST" || got["body"] != "hi" {
		t.Errorf("preview request %v", got)
	}
}

func TestSetNetwork(t *testing.T) {
	t.Parallel()
	c, _ := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{Network: &airlock.Network{Mode: airlock.NetworkDeny}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.SetNetwork(ctx, sb.ID, airlock.NetworkPolicy{Mode: airlock.NetworkDeny, Allow: []string{"pypi.org", "*.pythonhosted.org:443"}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Applied != airlock.AppliedRunning || st.Closed != 1 || st.Network.Mode != "deny" || len(st.Network.Allow) != 2 {
		t.Fatalf("set: %+v", st)
	}
	got, err := c.GetNetwork(ctx, sb.ID)
	if err != nil || got.Network.Mode != "deny" || len(got.Network.Allow) != 2 || got.Network.Allow[0] != "pypi.org" {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := c.SetNetwork(ctx, sb.ID, airlock.NetworkPolicy{Allow: []string{"10.0.0.1"}}); !errors.Is(err, airlock.ErrPermissionDenied) {
		t.Fatalf("floor rule: %v", err)
	}
	if _, err := c.SetNetwork(ctx, "nosuchsandboxaaaaaaa", airlock.NetworkPolicy{}); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
}
