package dns

import (
	"context"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

func FuzzHandle(f *testing.F) {
	for _, q := range []struct {
		n string
		t uint16
	}{{"example.com.", mdns.TypeA}, {"2852039166.", mdns.TypeA}, {"www.example.com.", mdns.TypeAAAA}, {"1.0.0.127.in-addr.arpa.", mdns.TypePTR}, {"x.", mdns.TypeANY}} {
		m := new(mdns.Msg)
		m.SetQuestion(q.n, q.t)
		m.SetEdns0(4096, true)
		b, _ := m.Pack()
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, 12))
	fx := newFixture(f, "deny", []string{"example.com", "*.example.com"}, func(c *Config) {
		c.Timeout = 50 * time.Millisecond
		c.QueryRate = 1 << 20
	})
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		out := fx.r.ServeDNS(ctx, b)
		if len(out) > maxUDPSize {
			t.Fatalf("UDP response of %d bytes", len(out))
		}
		_ = fx.r.serve(ctx, b, true)
	})
}
