package dns

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Config defaults.
const (
	DefaultQueryRate   = 50
	DefaultMaxInflight = 32
	DefaultTimeout     = 3 * time.Second
	DefaultMaxTTL      = 300 * time.Second
)

// Config configures a Resolver for one sandbox.
type Config struct {
	// Policy decides which names may be resolved and which answers returned.
	Policy policy.Policy
	// Pins receives the addresses of allowed answers. Required.
	Pins *policy.PinSet
	// Upstream are the host's resolvers as "ip:port" (IP literals only, so
	// that configuring the server never resolves a name). At least one.
	Upstream []string
	// Clock gives the time for the rate limit, pins and audit events;
	// nil means time.Now. Network deadlines always use real time.
	Clock func() time.Time
	// QueryRate is the sustained number of queries per second (token
	// bucket); Burst is the bucket size. Zero means DefaultQueryRate and
	// QueryRate respectively.
	QueryRate int
	Burst     int
	// MaxInflight caps upstream queries in progress; zero means
	// DefaultMaxInflight.
	MaxInflight int
	// Timeout bounds one question's upstream work; zero means DefaultTimeout.
	Timeout time.Duration
	// MaxTTL caps the TTLs given to the guest; zero means DefaultMaxTTL.
	MaxTTL time.Duration
	// Audit, when set, receives one Event per query, synchronously: it
	// must not block.
	Audit func(Event)
	// Logger receives debug logs; nil discards them.
	Logger *slog.Logger
}

// Validate checks c without applying defaults. Errors wrap errdefs.ErrInvalid.
func (c *Config) Validate() error {
	var errs []error
	if c.Pins == nil {
		errs = append(errs, errors.New("pins: required"))
	}
	if len(c.Upstream) == 0 {
		errs = append(errs, errors.New("upstream: at least one resolver is required"))
	}
	for i, u := range c.Upstream {
		if _, err := netip.ParseAddrPort(u); err != nil {
			errs = append(errs, fmt.Errorf("upstream[%d] %q: want ip:port", i, u))
		}
	}
	if c.QueryRate < 0 || c.Burst < 0 || c.MaxInflight < 0 || c.Timeout < 0 || c.MaxTTL < 0 {
		errs = append(errs, errors.New("limits: negative value"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: dns config: %w", errdefs.ErrInvalid, err)
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.QueryRate == 0 {
		c.QueryRate = DefaultQueryRate
	}
	if c.Burst == 0 {
		c.Burst = c.QueryRate
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Event is the audit record of one query.
type Event struct {
	Time  time.Time
	Name  string // the question name as asked (bounded), or "" without a question
	QType string // "A", "AAAA", ...
	// Rcode is the response code sent ("NOERROR", "NXDOMAIN", ...), or
	// "DROP" when no response was sent.
	Rcode string
	// RuleID and Reason say what decided: a policy rule ID
	// ("allow[0]", "mode:deny", "floor:loopback", "name:literal", ...) or a
	// check of this package ("query:formerr", "qtype:refused",
	// "rate:limit", "inflight:limit", "upstream:error", ...).
	RuleID string
	Reason string
	// Forwarded reports whether an upstream query was sent.
	Forwarded bool
	// Answers are the addresses returned to the guest (and pinned).
	Answers []netip.Addr
}
