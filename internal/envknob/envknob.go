package envknob

import (
	"os"
	"slices"
)

// Knob is one environment variable airlock reads.
type Knob struct {
	// Name is the variable's name.
	Name string
	// Doc says what it does, in one sentence.
	Doc string
	// TestHook marks knobs that exist for tests (and the benchmarks) only:
	// never set them in production.
	TestHook bool
}

// Get returns the knob's value ("" when unset).
func (k Knob) Get() string { return os.Getenv(k.Name) }

// Lookup returns the knob's value and whether it is set.
func (k Knob) Lookup() (string, bool) { return os.LookupEnv(k.Name) }

// Setting returns "NAME=value", for a child process's environment.
func (k Knob) Setting(value string) string { return k.Name + "=" + value }

var knobs []Knob

func register(name, doc string, testHook bool) Knob {
	k := Knob{Name: name, Doc: doc, TestHook: testHook}
	knobs = append(knobs, k)
	return k
}

// All returns every registered knob, in declaration order.
func All() []Knob { return slices.Clone(knobs) }

// The shim's knobs: the command that builds the sandbox.Manager reads them
// into Manager.Shim, and each shim gets the values in its configuration
// document (internal/shimconf); the shim process reads no knob.
var (
	// DNS lists the resolvers ("ip[:port],...") the shim forwards guest DNS
	// queries to; unset: the nameservers of /etc/resolv.conf.
	DNS = register("AIRLOCK_DNS",
		"resolvers (ip[:port],...) the shim forwards guest DNS queries to; default: /etc/resolv.conf", false)
	// UpstreamCAFile is a PEM file of extra CAs trusted for the upstreams of
	// intercepted (secret-bearing) connections, e.g. a corporate proxy CA.
	UpstreamCAFile = register("AIRLOCK_UPSTREAM_CA_FILE",
		"PEM file of extra CAs trusted for the upstreams of intercepted connections", false)
	// ProcAudit is "off" to run sandboxes without the guest process audit
	// (the trail of every program the guest starts); unset or "on": on.
	ProcAudit = register("AIRLOCK_PROC_AUDIT",
		"off: sandboxes started by this process do not record the programs their guest runs (default on)", false)
	// TestDialMap is a TEST HOOK: "a.b.c.d=w.x.y.z,..." makes the shim dial
	// w.x.y.z whenever the policy allowed a flow to a.b.c.d (same port), so
	// a listener on this machine can stand in for a public address. The
	// policy still decides on a.b.c.d.
	TestDialMap = register("AIRLOCK_TEST_DIAL_MAP",
		"TEST HOOK: a.b.c.d=w.x.y.z,... the shim dials w.x.y.z where the policy allowed a.b.c.d", true)
)
