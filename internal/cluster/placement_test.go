package cluster

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func testNode(name string, cpus int, memMiB int64, runtimes ...string) Node {
	return Node{Name: name, Live: true, CPUs: cpus, MemoryMiB: memMiB, Runtimes: runtimes, Arch: "amd64"}
}

func TestPlaceSaysWhyNothingFits(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	req := Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512}
	if _, err := Place(nil, req, Limits{}, 2, rnd); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("no nodes: %v", err)
	}
	dead := testNode("a", 4, 8192, "qemu")
	dead.Live = false
	draining := testNode("b", 4, 8192, "qemu")
	draining.Draining = true
	if _, err := Place([]Node{dead, draining}, req, Limits{}, 2, rnd); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a dead and a draining node: %v", err)
	}
	gv := testNode("g", 4, 8192, "gvisor")
	if _, err := Place([]Node{gv}, req, Limits{}, 2, rnd); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("only gvisor nodes for a qemu sandbox: %v", err)
	}
	if _, err := Place([]Node{testNode("q", 4, 8192, "qemu")}, Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512, Arch: "arm64"}, Limits{}, 2, rnd); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a saved state of another architecture: %v", err)
	}
	full := testNode("f", 2, 1024, "qemu")
	full.AllocatedMemoryMiB = 1300 // of 1536 with the default 1.5 overcommit
	if _, err := Place([]Node{full}, req, Limits{}, 2, rnd); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a full node: %v", err)
	}
	cpuFull := testNode("c", 1, 65536, "qemu")
	cpuFull.AllocatedCPUs = 4 // the default 4 vCPUs per CPU
	if _, err := Place([]Node{cpuFull}, req, Limits{}, 2, rnd); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a node out of vCPUs: %v", err)
	}
	counted := testNode("m", 64, 65536, "qemu")
	counted.Sandboxes = 10
	if _, err := Place([]Node{counted}, req, Limits{MaxSandboxes: 10}, 2, rnd); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a node at its sandbox limit: %v", err)
	}
}

// TestPlaceSpreadsAndFavoursRoom: with every node sampled (k = all), the
// emptiest fitting node wins; with best-of-2 over many placements the
// load spreads evenly (each placement adds to its node).
func TestPlaceSpreadsAndFavoursRoom(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	busy := testNode("busy", 8, 16384, "qemu", "gvisor")
	busy.AllocatedMemoryMiB = 12000
	idle := testNode("idle", 8, 16384, "qemu", "gvisor")
	small := testNode("small", 2, 2048, "qemu")
	got, err := Place([]Node{busy, idle, small}, Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512}, Limits{}, 3, rnd)
	if err != nil || got.Name != "idle" {
		t.Fatalf("placed on %q (%v), want idle", got.Name, err)
	}

	nodes := make([]Node, 10)
	for i := range nodes {
		nodes[i] = testNode(string(rune('a'+i)), 32, 65536, "qemu")
	}
	counts := map[string]int{}
	for range 1000 {
		n, err := Place(nodes, Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 256}, Limits{}, DefaultChoices, rnd)
		if err != nil {
			t.Fatal(err)
		}
		counts[n.Name]++
		for i := range nodes {
			if nodes[i].Name == n.Name {
				nodes[i].AllocatedCPUs++
				nodes[i].AllocatedMemoryMiB += 256
				nodes[i].Sandboxes++
			}
		}
	}
	lo, hi := 1000, 0
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	if len(counts) != 10 || hi-lo > 10 {
		t.Fatalf("1000 placements over 10 equal nodes: %v (spread %d)", counts, hi-lo)
	}
	t.Logf("1000 placements, best of %d: per node %d..%d", DefaultChoices, lo, hi)
}

// TestPlacePrefersAWarmSandbox: a node with a ready warm sandbox of the
// request's image, CPUs and memory wins over emptier nodes; one of
// another kind, or none ready, does not count, and a full node's warm
// sandbox does not make it fit.
func TestPlacePrefersAWarmSandbox(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	req := Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512, Image: "python"}
	busy := testNode("busy", 4, 8192, "qemu")
	busy.AllocatedCPUs, busy.AllocatedMemoryMiB = 8, 6000
	busy.Warm = []WarmReady{{Image: "python", CPUs: 1, MemoryMiB: 512, Ready: 1}}
	other := testNode("other", 4, 8192, "qemu")
	other.Warm = []WarmReady{{Image: "python", CPUs: 2, MemoryMiB: 512, Ready: 3}, {Image: "base", CPUs: 1, MemoryMiB: 512, Ready: 3}}
	empty := testNode("empty", 4, 8192, "qemu")
	empty.Warm = []WarmReady{{Image: "python", CPUs: 1, MemoryMiB: 512, Ready: 0}}
	for range 20 {
		n, err := Place([]Node{other, busy, empty}, req, Limits{}, 3, rnd)
		if err != nil || n.Name != "busy" {
			t.Fatalf("placed on %s (%v), want the node with a warm python sandbox", n.Name, err)
		}
	}
	// Without an image, room decides.
	noImage := req
	noImage.Image = ""
	if n, _ := Place([]Node{other, busy, empty}, noImage, Limits{}, 3, rnd); n.Name == "busy" {
		t.Fatal("a request without an image went to the busiest node")
	}
	full := busy
	full.AllocatedMemoryMiB = 12288
	if n, err := Place([]Node{full, other}, req, Limits{}, 3, rnd); err != nil || n.Name != "other" {
		t.Fatalf("a full node with a warm sandbox: placed on %s (%v)", n.Name, err)
	}
}

// TestPlaceOnlyOnNodesWithTheTemplate: a request limited to some nodes
// (those that built its template) goes to one of them, however much room
// the others have, and says why when none of them is live.
func TestPlaceOnlyOnNodesWithTheTemplate(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	busy := testNode("busy", 4, 8192, "qemu")
	busy.AllocatedCPUs = 10
	roomy := testNode("roomy", 64, 1<<20, "qemu")
	req := Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512, OnlyNodes: []string{"busy"}, OnlyWhy: "template py built"}
	for range 10 {
		if n, err := Place([]Node{roomy, busy}, req, Limits{}, 2, rnd); err != nil || n.Name != "busy" {
			t.Fatalf("placed on %s (%v), want the node with the template", n.Name, err)
		}
	}
	req.OnlyNodes = []string{}
	_, err := Place([]Node{roomy, busy}, req, Limits{}, 2, rnd)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no live node has template py built") {
		t.Fatalf("no node with the template: %v", err)
	}
}
