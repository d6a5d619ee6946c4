package shim

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netstack/guesttest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestLivePolicy: through the manager and the shim's NetworkService, a
// sandbox in deny mode reaches an address once a rule allows it, then a
// change that drops the rule closes the live connection; the close is a
// net.deny event in the catalog and each change a sandbox.network event.
// The shim refuses on its own a policy it cannot apply.
func TestLivePolicy(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	links := make(chan net.Conn, 1)
	h := newHarness(t, time.Hour, withNIC("deny", links))
	g, err := guesttest.Start(<-links)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx := t.Context()
	m := h.manager()
	dst := netip.AddrPortFrom(netip.MustParseAddr("93.184.215.10"), uint16(ln.Addr().(*net.TCPAddr).Port))

	if c, err := g.DialTCP(ctx, dst); err == nil {
		c.Close()
		t.Fatal("deny mode without rules: the guest connected")
	}
	ch, err := m.SetNetwork(ctx, sandbox.Local(), h.id, sandbox.EgressPolicy{Mode: "deny", Allow: []string{dst.Addr().String()}})
	if err != nil || ch.Applied != "running" {
		t.Fatalf("allow: %+v %v", ch, err)
	}
	c, err := g.DialTCP(ctx, dst)
	if err != nil {
		t.Fatalf("after the rule: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo: %q %v", b, err)
	}

	ch, err = m.SetNetwork(ctx, sandbox.Local(), h.id, sandbox.EgressPolicy{Mode: "deny"})
	if err != nil || ch.Closed != 1 {
		t.Fatalf("remove: %+v %v; want 1 closed", ch, err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection the new policy forbids is open")
	}
	var closes, changes int
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		evs, err := h.st.ListEvents(ctx, store.EventFilter{SandboxID: h.id})
		if err != nil {
			t.Fatal(err)
		}
		closes, changes = 0, 0
		for _, e := range evs {
			r, _ := e.Detail["reason"].(string)
			switch {
			case e.Action == "net.deny" && strings.HasPrefix(r, "closed by a policy change: ") && e.Detail["dst"] == dst.String():
				closes++
			case e.Action == "sandbox.network":
				changes++
			}
		}
		return closes == 1 && changes == 2
	}) {
		t.Fatalf("%d policy-change closes and %d sandbox.network events, want 1 and 2", closes, changes)
	}

	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	if _, err := sc.SetPolicy(ctx, "none", nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("mode none: %v", err)
	}
	if _, err := sc.SetPolicy(ctx, "deny", []string{"*.com"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad rule: %v", err)
	}
	h.stop(t)
}
