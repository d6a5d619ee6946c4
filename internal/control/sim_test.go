package control_test

import (
	"os"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/control/controlsim"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/pgtest"
)

// TestClusterSimulation: 10 nodes on the fake runtime, 1,000 sandboxes
// (-short: 3 and 60) created by 50 concurrent clients through two
// replicas, then an exec in each, then all paused, resumed and removed
// (controlsim). Every call must succeed, placement must spread the
// sandboxes evenly (each node within 25% of the mean), and nothing may be
// left on a node or in the catalog. The control tier's catalog is
// PostgreSQL where Debian's is installed and this runs as root, as in a
// cluster. It logs each phase's rate and latencies; make bench has the
// rate as a row.
func TestClusterSimulation(t *testing.T) {
	testutil.NeedTool(t, "qemu-img", "make deps")
	o := controlsim.Options{Nodes: 10, Sandboxes: 1000, Clients: 50, Dir: t.TempDir()}
	if testing.Short() {
		o.Nodes, o.Sandboxes, o.Clients = 3, 60, 6
	}
	if _, err := pgtest.Bin(); err == nil && os.Geteuid() == 0 && !testing.Short() {
		pg, err := pgtest.Start(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pg.Stop)
		if o.Catalog, err = pg.Database(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Log("the control tier's catalog is PostgreSQL")
	} else {
		t.Log("the control tier's catalog is SQLite (no PostgreSQL server here, or -short)")
	}
	res, err := controlsim.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range res.Phases {
		t.Logf("%-6s %4d sandboxes in %6.2fs: %6.1f/s, p50 %s, p99 %s", ph.Name, o.Sandboxes, ph.Wall.Seconds(), ph.Rate(),
			ph.Quantile(0.50).Round(time.Millisecond), ph.Quantile(0.99).Round(time.Millisecond))
	}
	mean := float64(o.Sandboxes) / float64(o.Nodes)
	t.Logf("placement: %v (mean %.0f)", res.PerNode, mean)
	if len(res.PerNode) != o.Nodes {
		t.Errorf("%d nodes got sandboxes, of %d", len(res.PerNode), o.Nodes)
	}
	for name, n := range res.PerNode {
		if float64(n) < 0.75*mean || float64(n) > 1.25*mean {
			t.Errorf("node %s got %d sandboxes; the mean is %.0f", name, n, mean)
		}
	}
}
