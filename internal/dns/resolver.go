package dns

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	mdns "github.com/miekg/dns"
	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Protocol limits.
const (
	maxUDPSize   = 1232 // largest UDP response to the guest and EDNS size offered upstream
	minUDPSize   = 512
	maxChain     = 8 // CNAME links followed in an answer
	maxNameInLog = 255
)

// forwarded are the query types sent upstream.
var forwarded = map[uint16]bool{
	mdns.TypeA: true, mdns.TypeAAAA: true, mdns.TypeCNAME: true, mdns.TypeTXT: true,
	mdns.TypeMX: true, mdns.TypeSRV: true, mdns.TypeNS: true, mdns.TypePTR: true,
	mdns.TypeSOA: true, mdns.TypeCAA: true, mdns.TypeNAPTR: true,
}

// Resolver answers one sandbox's DNS queries. It is safe for concurrent use
// and holds no goroutines of its own.
type Resolver struct {
	cfg      Config
	pol      atomic.Pointer[policy.Policy]
	limiter  *rate.Limiter
	inflight chan struct{}
	next     atomic.Uint32 // round-robin start among upstreams
}

// New returns a Resolver for cfg, after Validate and with defaults applied.
func New(cfg Config) (*Resolver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.Upstream = append([]string(nil), cfg.Upstream...)
	r := &Resolver{
		cfg:      cfg,
		limiter:  rate.NewLimiter(rate.Limit(cfg.QueryRate), cfg.Burst),
		inflight: make(chan struct{}, cfg.MaxInflight),
	}
	p := cfg.Policy
	r.pol.Store(&p)
	return r, nil
}

// SetPolicy replaces the policy atomically; queries already past their
// name check finish under the old one. Existing pins are kept.
func (r *Resolver) SetPolicy(p policy.Policy) { r.pol.Store(&p) }

func (r *Resolver) policy() policy.Policy { return *r.pol.Load() }

// Handle answers one query. It returns nil when no response must be sent
// (req is itself a response). It never returns an error: failures become
// response codes. ctx bounds the upstream query. The returned message is
// not yet truncated to a transport size (see ServeDNS).
func (r *Resolver) Handle(ctx context.Context, req *mdns.Msg) *mdns.Msg {
	ev := Event{Time: r.cfg.Clock()}
	resp := r.handle(ctx, req, &ev)
	if resp == nil {
		ev.Rcode = "DROP"
	} else {
		ev.Rcode = mdns.RcodeToString[resp.Rcode]
		if ev.Rcode == "" {
			ev.Rcode = strconv.Itoa(resp.Rcode)
		}
	}
	if r.cfg.Audit != nil {
		r.cfg.Audit(ev)
	}
	if r.cfg.Logger.Enabled(ctx, -4) {
		r.cfg.Logger.DebugContext(ctx, "dns query", "name", ev.Name, "qtype", ev.QType, "rcode", ev.Rcode,
			"rule_id", ev.RuleID, "reason", ev.Reason, "forwarded", ev.Forwarded, "answers", len(ev.Answers))
	}
	return resp
}

func reply(req *mdns.Msg, rcode int, ev *Event, rule, reason string) *mdns.Msg {
	ev.RuleID, ev.Reason = rule, reason
	m := new(mdns.Msg)
	m.Id = req.Id
	m.Response = true
	m.Opcode = req.Opcode
	m.RecursionDesired = req.RecursionDesired
	m.RecursionAvailable = true
	m.Rcode = rcode
	if req.Opcode == mdns.OpcodeQuery && len(req.Question) == 1 {
		m.Question = []mdns.Question{req.Question[0]}
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(maxUDPSize, false)
	}
	return m
}

func (r *Resolver) handle(ctx context.Context, req *mdns.Msg, ev *Event) *mdns.Msg {
	if req == nil || req.Response {
		ev.RuleID, ev.Reason = "query:response", "a response sent to the server is dropped"
		return nil
	}
	if len(req.Question) == 1 {
		q := req.Question[0]
		ev.Name = q.Name
		if len(ev.Name) > maxNameInLog {
			ev.Name = ev.Name[:maxNameInLog] + "..."
		}
		ev.QType = mdns.Type(q.Qtype).String()
	}
	if !r.limiter.AllowN(r.cfg.Clock(), 1) {
		return reply(req, mdns.RcodeRefused, ev, "rate:limit", "query rate limit reached")
	}
	if req.Opcode != mdns.OpcodeQuery {
		return reply(req, mdns.RcodeNotImplemented, ev, "query:opcode", "opcode "+strconv.Itoa(req.Opcode)+" is not supported")
	}
	if len(req.Question) != 1 {
		return reply(req, mdns.RcodeFormatError, ev, "query:formerr", strconv.Itoa(len(req.Question))+" questions, want 1")
	}
	nopt := 0
	for _, rr := range req.Extra {
		if rr.Header().Rrtype == mdns.TypeOPT {
			nopt++
		}
	}
	if nopt > 1 {
		return reply(req, mdns.RcodeFormatError, ev, "query:formerr", "more than one OPT record")
	}
	if opt := req.IsEdns0(); opt != nil && opt.Version() != 0 {
		return reply(req, mdns.RcodeBadVers, ev, "query:badvers", "EDNS version "+strconv.Itoa(int(opt.Version()))+" is not supported")
	}
	q := req.Question[0]
	if q.Qclass != mdns.ClassINET {
		return reply(req, mdns.RcodeRefused, ev, "qclass:refused", "class "+mdns.Class(q.Qclass).String()+" is not served")
	}
	switch q.Qtype {
	case mdns.TypeANY, mdns.TypeAXFR, mdns.TypeIXFR:
		return reply(req, mdns.RcodeRefused, ev, "qtype:refused", "query type "+ev.QType+" is refused")
	}
	pol := r.policy()
	// Names: literals, validity, metadata, mode; never forwarded when denied.
	raw := q.Name
	if a, ok := policy.ParseHostLiteral(raw); ok {
		return reply(req, mdns.RcodeNameError, ev, "name:literal", "the name is the IP literal "+a.String())
	}
	d := policy.NameAllowed(pol, raw)
	if !d.Allow {
		return reply(req, mdns.RcodeNameError, ev, d.RuleID, d.Reason)
	}
	name, err := policy.NormalizeName(raw)
	if err != nil { // NameAllowed normalised it already; kept for safety
		return reply(req, mdns.RcodeNameError, ev, "name:invalid", "the name is invalid")
	}
	if rule, reason, ok := reverseAllowed(name); !ok {
		return reply(req, mdns.RcodeNameError, ev, rule, reason)
	}
	if q.Qtype == mdns.TypeHTTPS || q.Qtype == mdns.TypeSVCB {
		return reply(req, mdns.RcodeSuccess, ev, "qtype:nodata", "query type "+ev.QType+" is answered empty (address hints bypass the rebinding check)")
	}
	if !forwarded[q.Qtype] {
		return reply(req, mdns.RcodeRefused, ev, "qtype:refused", "query type "+ev.QType+" is not served")
	}
	select {
	case r.inflight <- struct{}{}:
	default:
		return reply(req, mdns.RcodeServerFailure, ev, "inflight:limit", "too many upstream queries in flight")
	}
	ev.Forwarded = true
	up, err := r.exchange(ctx, mdns.Question{Name: mdns.Fqdn(name), Qtype: q.Qtype, Qclass: mdns.ClassINET})
	<-r.inflight
	if err != nil {
		return reply(req, mdns.RcodeServerFailure, ev, "upstream:error", "upstream query: "+err.Error())
	}
	if up.Rcode != mdns.RcodeSuccess && up.Rcode != mdns.RcodeNameError {
		return reply(req, mdns.RcodeServerFailure, ev, "upstream:rcode", "upstream answered "+mdns.RcodeToString[up.Rcode])
	}
	return r.filter(pol, req, name, up, ev)
}

// filter builds the guest's response from the upstream answer up to the
// question for name (normalised), applying the rebinding checks and pinning.
func (r *Resolver) filter(pol policy.Policy, req *mdns.Msg, name string, up *mdns.Msg, ev *Event) *mdns.Msg {
	q := req.Question[0]
	owner := func(rr mdns.RR) string {
		n, err := policy.NormalizeName(rr.Header().Name)
		if err != nil {
			return ""
		}
		return n
	}
	// Every address record in the answer, whatever its owner, must pass.
	for _, rr := range up.Answer {
		if ip, ok := addrOf(rr); ok {
			if d := policy.DNSAnswerAllowed(pol, name, ip); !d.Allow {
				return reply(req, mdns.RcodeNameError, ev, d.RuleID, d.Reason)
			}
		}
	}
	// Walk the CNAME chain from the question name.
	chain := []string{name}
	var links []mdns.RR
	for cur := name; len(chain) <= maxChain; {
		var next *mdns.CNAME
		for _, rr := range up.Answer {
			if c, ok := rr.(*mdns.CNAME); ok && owner(c) == cur {
				next = c
				break
			}
		}
		if next == nil {
			break
		}
		if a, ok := policy.ParseHostLiteral(next.Target); ok {
			return reply(req, mdns.RcodeNameError, ev, "name:literal", "CNAME target is the IP literal "+a.String())
		}
		tgt, err := policy.NormalizeName(next.Target)
		if err != nil {
			return reply(req, mdns.RcodeNameError, ev, "name:invalid", "CNAME target is not a valid name")
		}
		if d := policy.NameAllowed(pol, tgt); !d.Allow && d.RuleID != "mode:deny" {
			return reply(req, mdns.RcodeNameError, ev, d.RuleID, "CNAME target: "+d.Reason)
		}
		if slicesContains(chain, tgt) {
			break // loop
		}
		links = append(links, next)
		chain = append(chain, tgt)
		cur = tgt
	}
	inChain := func(rr mdns.RR) bool { return slicesContains(chain, owner(rr)) }

	resp := reply(req, up.Rcode, ev, "", "")
	maxTTL := uint32(r.cfg.MaxTTL / 1e9)
	minTTL := maxTTL
	keep := func(rr mdns.RR) mdns.RR {
		rr = mdns.Copy(rr)
		h := rr.Header()
		h.Ttl = min(h.Ttl, maxTTL)
		if owner(rr) == name {
			h.Name = q.Name // echo the guest's spelling
		}
		return rr
	}
	var addrs []netip.Addr
	for _, rr := range links {
		k := keep(rr)
		minTTL = min(minTTL, k.Header().Ttl)
		resp.Answer = append(resp.Answer, k)
	}
	for _, rr := range up.Answer {
		if rr.Header().Rrtype != q.Qtype || q.Qtype == mdns.TypeCNAME || rr.Header().Class != mdns.ClassINET || !inChain(rr) {
			continue
		}
		k := keep(rr)
		if ip, ok := addrOf(k); ok {
			addrs = append(addrs, ip)
			minTTL = min(minTTL, k.Header().Ttl)
		}
		resp.Answer = append(resp.Answer, k)
	}
	for _, rr := range up.Ns {
		if rr.Header().Rrtype == mdns.TypeSOA {
			resp.Ns = append(resp.Ns, keep(rr))
		}
	}
	rule, reason := "upstream", "answered by upstream"
	if d := policy.NameAllowed(pol, name); d.Allow {
		rule, reason = d.RuleID, d.Reason
	}
	ev.RuleID, ev.Reason = rule, reason
	if len(addrs) > 0 {
		now := r.cfg.Clock()
		ttl := durationSeconds(minTTL)
		for _, n := range chain {
			if n == name || policy.NameAllowed(pol, n).Allow {
				r.cfg.Pins.Add(n, addrs, ttl, now)
			}
		}
		ev.Answers = addrs
	}
	return resp
}

func addrOf(rr mdns.RR) (netip.Addr, bool) {
	switch v := rr.(type) {
	case *mdns.A:
		return netip.AddrFromSlice(v.A.To4())
	case *mdns.AAAA:
		return netip.AddrFromSlice(v.AAAA.To16())
	}
	return netip.Addr{}, false
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// reverseAllowed refuses reverse-mapping names unless they name one full
// public address: the host's resolvers must not be asked about private
// networks.
func reverseAllowed(name string) (rule, reason string, ok bool) {
	var a netip.Addr
	switch {
	case name == "in-addr.arpa" || strings.HasSuffix(name, ".in-addr.arpa"):
		labels := strings.Split(strings.TrimSuffix(name, "in-addr.arpa"), ".")
		labels = labels[:len(labels)-1] // trailing "" before the suffix
		if len(labels) != 4 {
			return "name:reverse", "reverse name is not one IPv4 address", false
		}
		var b [4]byte
		for i, l := range labels {
			n, err := strconv.ParseUint(l, 10, 8)
			if err != nil || (len(l) > 1 && l[0] == '0') {
				return "name:reverse", "reverse name is not one IPv4 address", false
			}
			b[3-i] = byte(n)
		}
		a = netip.AddrFrom4(b)
	case name == "ip6.arpa" || strings.HasSuffix(name, ".ip6.arpa"):
		labels := strings.Split(strings.TrimSuffix(name, "ip6.arpa"), ".")
		labels = labels[:len(labels)-1]
		if len(labels) != 32 {
			return "name:reverse", "reverse name is not one IPv6 address", false
		}
		var b [16]byte
		for i, l := range labels {
			n, err := strconv.ParseUint(l, 16, 4)
			if err != nil || len(l) != 1 {
				return "name:reverse", "reverse name is not one IPv6 address", false
			}
			j := 31 - i
			b[j/2] |= byte(n) << (4 * (1 - j%2))
		}
		a = netip.AddrFrom16(b)
	default:
		return "", "", true
	}
	if c, _ := policy.Classify(a); c.Floor() {
		return "floor:" + c.String(), "reverse lookup of " + a.String() + ", which is " + c.String(), false
	}
	return "", "", true
}
