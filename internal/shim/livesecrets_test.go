package shim

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/netstack/guesttest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
)

// TestLiveSecrets: through the manager and the shim's NetworkService, a
// running sandbox without secrets gets one (its engine makes a CA, new
// execs get the placeholder in their default environment) and loses it
// (no CA, no placeholder); the shim refuses on its own a set it cannot
// apply.
func TestLiveSecrets(t *testing.T) {
	t.Parallel()
	links := make(chan net.Conn, 1)
	h := newHarness(t, time.Hour, withNIC("public", links))
	g, err := guesttest.Start(<-links)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx := t.Context()
	m := h.manager()
	if h.s.net.eng.CACertPEM() != nil {
		t.Fatal("a CA without secrets")
	}
	ch, err := m.SetSecret(ctx, sandbox.Local(), h.id, netconf.Secret{Name: "TOKEN", Hosts: []string{"api.test"}}, "shim-live-value-1")
	if err != nil || ch.Applied != "running" || len(ch.Network.Secrets) != 1 {
		t.Fatalf("set: %+v %v", ch, err)
	}
	ph := ch.Network.Secrets[0].Placeholder
	if h.s.net.eng.CACertPEM() == nil {
		t.Fatal("no CA after a secret was added")
	}
	if env := h.s.defEnv.get(); !slices.Contains(env, "TOKEN="+ph) || !slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "SSL_CERT_FILE=") }) {
		t.Fatalf("default env of new execs %q", env)
	}

	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	if _, err := sc.SetSecrets(ctx, []netconf.Secret{{Name: "X", Hosts: []string{"a.test"}, Placeholder: netconf.NewPlaceholder()}}, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a secret without a value: %v", err)
	}
	if env := h.s.defEnv.get(); !slices.Contains(env, "TOKEN="+ph) {
		t.Fatalf("a refused set changed the env: %q", env)
	}

	if ch, err := m.RemoveSecret(ctx, sandbox.Local(), h.id, "TOKEN"); err != nil || ch.Applied != "running" || len(ch.Network.Secrets) != 0 {
		t.Fatalf("remove: %+v %v", ch, err)
	}
	if h.s.net.eng.CACertPEM() != nil {
		t.Error("the CA is still there after the last secret was removed")
	}
	if env := h.s.defEnv.get(); slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "TOKEN=") }) {
		t.Errorf("default env after removal %q", env)
	}
	h.stop(t)
}
