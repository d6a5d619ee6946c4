package policy

import (
	"container/list"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// PinSet defaults.
const (
	DefaultPinMinTTL     = 30 * time.Second
	DefaultPinMaxTTL     = time.Hour
	DefaultPinMaxEntries = 4096
)

// PinSet remembers, per sandbox, which names the sandbox's own DNS queries
// resolved to which addresses, so a domain rule can match a flow by its
// destination IP (DNS pinning). Entries expire after their TTL, clamped to
// [MinTTL, MaxTTL]; at most MaxEntries (name, address) pairs are kept and the
// least recently added is evicted first, so a guest cannot grow it without
// bound. Time is always passed in. The zero value is not usable: use
// NewPinSet. A PinSet is safe for concurrent use.
type PinSet struct {
	minTTL, maxTTL time.Duration
	max            int

	mu    sync.Mutex
	order *list.List                              // of *pin, oldest first
	byIP  map[netip.Addr]map[string]*list.Element // normalised address -> name -> element
}

type pin struct {
	name    string
	ip      netip.Addr
	expires time.Time
}

// NewPinSet returns an empty PinSet. Zero or negative arguments take the
// defaults; maxTTL below minTTL is raised to minTTL.
func NewPinSet(minTTL, maxTTL time.Duration, maxEntries int) *PinSet {
	if minTTL <= 0 {
		minTTL = DefaultPinMinTTL
	}
	if maxTTL <= 0 {
		maxTTL = DefaultPinMaxTTL
	}
	maxTTL = max(maxTTL, minTTL)
	if maxEntries <= 0 {
		maxEntries = DefaultPinMaxEntries
	}
	return &PinSet{minTTL: minTTL, maxTTL: maxTTL, max: maxEntries, order: list.New(), byIP: map[netip.Addr]map[string]*list.Element{}}
}

// Add records that name resolved to ips with the answer's ttl at time now.
// Invalid names and addresses are ignored. Re-adding a pair refreshes it: its
// expiry becomes the later of the old and the new one, and it becomes the
// newest entry.
func (s *PinSet) Add(name string, ips []netip.Addr, ttl time.Duration, now time.Time) {
	n, err := NormalizeName(name)
	if err != nil {
		return
	}
	ttl = min(max(ttl, s.minTTL), s.maxTTL)
	exp := now.Add(ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ip := range ips {
		ip = Normalize(ip)
		if !ip.IsValid() {
			continue
		}
		names := s.byIP[ip]
		if e, ok := names[n]; ok {
			p := e.Value.(*pin)
			if exp.After(p.expires) {
				p.expires = exp
			}
			s.order.MoveToBack(e)
			continue
		}
		if names == nil {
			names = map[string]*list.Element{}
			s.byIP[ip] = names
		}
		names[n] = s.order.PushBack(&pin{name: n, ip: ip, expires: exp})
		for s.order.Len() > s.max {
			s.remove(s.order.Front())
		}
	}
}

func (s *PinSet) remove(e *list.Element) {
	p := s.order.Remove(e).(*pin)
	names := s.byIP[p.ip]
	delete(names, p.name)
	if len(names) == 0 {
		delete(s.byIP, p.ip)
	}
}

// Lookup returns, sorted, the names that resolved to ip and have not expired
// at now. It drops the expired entries it meets.
func (s *PinSet) Lookup(ip netip.Addr, now time.Time) []string {
	ip = Normalize(ip)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n, e := range s.byIP[ip] {
		if now.Before(e.Value.(*pin).expires) {
			out = append(out, n)
		} else {
			s.remove(e)
		}
	}
	slices.Sort(out)
	return out
}

// Len returns the number of (name, address) pairs held, expired ones included
// until they are evicted or met by Lookup.
func (s *PinSet) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}
