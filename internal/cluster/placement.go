package cluster

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Request is what a new sandbox needs from the node that runs it.
type Request struct {
	Runtime   string // "qemu" or "gvisor"; "" for any
	CPUs      int
	MemoryMiB int64
	// Arch, if set, is the CPU architecture the sandbox needs (a resume
	// or a snapshot's copy: its saved state runs only there).
	Arch string
	// OnlyNodes, if not nil, are the only nodes that may take it (those
	// that built its SandboxTemplate); OnlyWhy names what they have, for
	// the error when none of them is live.
	OnlyNodes []string
	OnlyWhy   string
	// Image, if set, is the image of a new sandbox: nodes whose warm
	// pools hold a ready sandbox of it (and of CPUs and MemoryMiB) go
	// first, since a create there takes that sandbox instead of starting
	// one.
	Image string
}

// Limits bound how far placement fills a node.
type Limits struct {
	// CPUOvercommit is how many vCPUs a node may give per CPU it has
	// (idle sandboxes use little; default 4).
	CPUOvercommit float64
	// MemoryOvercommit is how much guest memory a node may give per byte
	// it has (guests touch little of theirs; default 1.5).
	MemoryOvercommit float64
	// MaxSandboxes per node (0: no limit but the others).
	MaxSandboxes int
}

func (l Limits) withDefaults() Limits {
	if l.CPUOvercommit <= 0 {
		l.CPUOvercommit = 4
	}
	if l.MemoryOvercommit <= 0 {
		l.MemoryOvercommit = 1.5
	}
	return l
}

// DefaultChoices is the K of best-of-K: how many eligible nodes placement
// samples before it takes the one with the most room. Two already spreads
// load nearly as well as looking at all of them, and replicas that place
// at once rarely pick the same node.
const DefaultChoices = 2

// Place picks the node for req among nodes: of the nodes that are live,
// not draining, run req's runtime and architecture, and have room within
// lim, it samples k at random and takes the one with the most room left
// (the smaller of its free CPU and free memory shares); rnd nil is the
// global source. The error says
// why no node fits: ErrUnavailable when no node is live,
// ErrFailedPrecondition when none runs what req needs, and
// ErrResourceExhausted when those that do are full.
func Place(nodes []Node, req Request, lim Limits, k int, rnd *rand.Rand) (Node, error) {
	lim = lim.withDefaults()
	k = max(k, 1)
	var live, compatible, fits []Node
	for _, n := range nodes {
		if !n.Live || n.Draining {
			continue
		}
		live = append(live, n)
		if (req.Runtime != "" && !slices.Contains(n.Runtimes, req.Runtime)) || (req.Arch != "" && n.Arch != req.Arch) ||
			(req.OnlyNodes != nil && !slices.Contains(req.OnlyNodes, n.Name)) {
			continue
		}
		compatible = append(compatible, n)
		if room(n, req, lim) >= 0 {
			fits = append(fits, n)
		}
	}
	switch {
	case len(live) == 0:
		return Node{}, fmt.Errorf("%w: no airlock node is live (each node renews a Lease; see `kubectl get leases -n airlock`)", errdefs.ErrUnavailable)
	case len(compatible) == 0 && req.OnlyNodes != nil:
		return Node{}, fmt.Errorf("%w: no live node has %s (live: %s)", errdefs.ErrFailedPrecondition, req.OnlyWhy, names(live))
	case len(compatible) == 0:
		what := "the " + cmp.Or(req.Runtime, "any") + " runtime"
		if req.Arch != "" {
			what += " on " + req.Arch
		}
		return Node{}, fmt.Errorf("%w: no live node runs %s (live: %s)", errdefs.ErrFailedPrecondition, what, names(live))
	case len(fits) == 0:
		return Node{}, fmt.Errorf("%w: no node has room for %d vCPUs and %d MiB (%d nodes run %s, all full)", errdefs.ErrResourceExhausted, req.CPUs, req.MemoryMiB, len(compatible), cmp.Or(req.Runtime, "sandboxes"))
	}
	if warm := slices.DeleteFunc(slices.Clone(fits), func(n Node) bool { return !hasWarm(n, req) }); len(warm) > 0 {
		fits = warm
	}
	// Shuffled always: of nodes with equal room, the first sampled wins,
	// so equal nodes share the load.
	shuffle := rand.Shuffle
	if rnd != nil {
		shuffle = rnd.Shuffle
	}
	shuffle(len(fits), func(i, j int) { fits[i], fits[j] = fits[j], fits[i] })
	fits = fits[:min(k, len(fits))]
	return slices.MaxFunc(fits, func(a, b Node) int { return cmp.Compare(room(a, req, lim), room(b, req, lim)) }), nil
}

// room is the share of node n left once req is on it: the smaller of its
// CPU and memory shares within lim, negative when req does not fit.
func room(n Node, req Request, lim Limits) float64 {
	if lim.MaxSandboxes > 0 && n.Sandboxes+1 > lim.MaxSandboxes {
		return -1
	}
	cpus := float64(n.CPUs) * lim.CPUOvercommit
	mem := float64(n.MemoryMiB) * lim.MemoryOvercommit
	if cpus <= 0 || mem <= 0 {
		return -1
	}
	freeCPU := (cpus - float64(n.AllocatedCPUs+req.CPUs)) / cpus
	freeMem := (mem - float64(n.AllocatedMemoryMiB+req.MemoryMiB)) / mem
	return min(freeCPU, freeMem)
}

// hasWarm reports whether n has a warm sandbox a create of req takes.
func hasWarm(n Node, req Request) bool {
	return req.Image != "" && slices.ContainsFunc(n.Warm, func(w WarmReady) bool {
		return w.Ready > 0 && w.Image == req.Image && w.CPUs == req.CPUs && int64(w.MemoryMiB) == req.MemoryMiB
	})
}

func names(nodes []Node) string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name+" ("+strings.Join(n.Runtimes, ",")+" "+n.Arch+")")
	}
	return strings.Join(out, ", ")
}
