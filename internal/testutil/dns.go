package testutil

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	mdns "github.com/miekg/dns"
)

// DNSServer is a test resolver on 127.0.0.1 (UDP and TCP, same port).
// Zone maps a lower-case name without the trailing dot to the A record
// answers of successive queries: the i-th query for a name gets Zone[name][i]
// (the last one once they run out), so a name can "rebind". Other names get
// NXDOMAIN; other query types for a known name get an empty answer.
// Queries counts the A queries seen per name.
type DNSServer struct {
	Addr string // "127.0.0.1:port"

	mu      sync.Mutex
	zone    map[string][]string
	queries map[string]int
}

// StartDNS starts a DNSServer for t.
func StartDNS(t testing.TB, zone map[string][]string) *DNSServer {
	t.Helper()
	s := &DNSServer{zone: zone, queries: map[string]int{}}
	// UDP and TCP on one port number: the kernel picks a free UDP port,
	// whose TCP twin another process may hold; try other ports then.
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	for range 50 {
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if err != nil {
		t.Fatalf("no port free for both UDP and TCP: %v", err)
	}
	s.Addr = pc.LocalAddr().String()
	for _, srv := range []*mdns.Server{{PacketConn: pc, Handler: s}, {Listener: ln, Handler: s}} {
		ready := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(ready) }
		go func() { _ = srv.ActivateAndServe() }()
		<-ready
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return s
}

// Queries returns how many A queries name (no trailing dot) got.
func (s *DNSServer) Queries(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[name]
}

// ServeDNS implements mdns.Handler.
func (s *DNSServer) ServeDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	m := new(mdns.Msg)
	m.SetReply(req)
	if len(req.Question) != 1 {
		m.Rcode = mdns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	s.mu.Lock()
	answers, ok := s.zone[name]
	i := s.queries[name]
	if q.Qtype == mdns.TypeA {
		s.queries[name]++
	}
	s.mu.Unlock()
	switch {
	case !ok || len(answers) == 0:
		m.Rcode = mdns.RcodeNameError
	case q.Qtype == mdns.TypeA:
		a := netip.MustParseAddr(answers[min(i, len(answers)-1)])
		m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: a.AsSlice()})
	}
	_ = w.WriteMsg(m)
}
