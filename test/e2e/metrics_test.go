package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// scrapeMetrics returns /metrics as series (name{labels} as the text
// format writes them) -> value.
func scrapeMetrics(t *testing.T, s *apiServer) map[string]float64 {
	t.Helper()
	code, b := s.do("", "GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, b)
	}
	return testutil.ParseMetrics(t, b)
}

// TestMetricsNetwork: /metrics reports a sandbox's network as its shim
// counts it. After the guest uploads a body to a server of this machine
// and downloads one from it (the stand-in public address, through the
// test dial map), the sandbox's transmit counter grew by at least the
// upload and its receive counter by at least the download, and its
// tenant's sums hold them.
func TestMetricsNetwork(t *testing.T) {
	e := setup(t)
	const up, down = 300 << 10, 1 << 20
	got := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		select {
		case got <- int(n):
		default:
		}
		_, _ = w.Write(bytes.Repeat([]byte("d"), down))
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	r := e.runWith(t, []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1"}, nil, "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	s := startServe(t, e)

	series := func(name string) string { return fmt.Sprintf("%s{sandbox_id=%q,tenant=%q}", name, id, "") }
	rx, tx := series("airlock_sandbox_network_receive_bytes_total"), series("airlock_sandbox_network_transmit_bytes_total")
	conns := series("airlock_sandbox_network_connections")
	before := scrapeMetrics(t, s)
	for _, k := range []string{rx, tx, conns} {
		if _, ok := before[k]; !ok {
			t.Fatalf("/metrics has no %s", k)
		}
	}

	script := fmt.Sprintf(`import urllib.request
req = urllib.request.Request("http://%s:%d/", data=b"u" * %d)
body = urllib.request.urlopen(req, timeout=120).read()
print(len(body))`, pubA, port, up)
	if out := strings.TrimSpace(e.must(t, "exec", id, "--", "python3", "-c", script)); out != strconv.Itoa(down) {
		t.Fatalf("the guest downloaded %q bytes, want %d", out, down)
	}
	select {
	case n := <-got:
		if n != up {
			t.Fatalf("the server got %d bytes, want %d", n, up)
		}
	default:
		t.Fatal("the guest downloaded the body but the server saw no request")
	}

	after := scrapeMetrics(t, s)
	t.Logf("receive %.0f -> %.0f, transmit %.0f -> %.0f bytes", before[rx], after[rx], before[tx], after[tx])
	if d := after[rx] - before[rx]; d < down {
		t.Errorf("receive grew by %.0f bytes (%.0f -> %.0f), want at least the %d downloaded", d, before[rx], after[rx], down)
	}
	if d := after[tx] - before[tx]; d < up {
		t.Errorf("transmit grew by %.0f bytes (%.0f -> %.0f), want at least the %d uploaded", d, before[tx], after[tx], up)
	}
	// The tenant's sums include this sandbox's (other sandboxes of the
	// local tenant may run in the same state dir).
	if v := after[`airlock_tenant_network_receive_bytes{tenant=""}`]; v < after[rx] {
		t.Errorf("the tenant's receive bytes %.0f < the sandbox's %.0f", v, after[rx])
	}
	if v := after[`airlock_tenant_network_transmit_bytes{tenant=""}`]; v < after[tx] {
		t.Errorf("the tenant's transmit bytes %.0f < the sandbox's %.0f", v, after[tx])
	}
	if _, ok := after[`airlock_tenant_network_connections{tenant=""}`]; !ok {
		t.Error("/metrics has no airlock_tenant_network_connections for the local tenant")
	}
	// Egress: the payload sent upstream (the upload and its request
	// headers), per sandbox and in the tenant's total, which keeps the
	// sandbox's bytes once it is gone.
	eg := series("airlock_sandbox_network_egress_bytes_total")
	const tenantEgress = `airlock_tenant_network_egress_bytes_total{tenant=""}`
	if d := after[eg] - before[eg]; d < up || d > up+4096 {
		t.Errorf("egress grew by %.0f bytes (%.0f -> %.0f), want the %d uploaded plus the request's headers", d, before[eg], after[eg], up)
	}
	if after[tenantEgress] < after[eg] {
		t.Errorf("the tenant's egress total %.0f < the sandbox's %.0f", after[tenantEgress], after[eg])
	}
	e.must(t, "rm", id)
	if gone := scrapeMetrics(t, s); gone[tenantEgress] < after[tenantEgress] {
		t.Errorf("the tenant's egress total fell from %.0f to %.0f when the sandbox was removed", after[tenantEgress], gone[tenantEgress])
	}
	// A server that never saw the sandbox counts it too: its shim recorded
	// the run's egress in the catalog when it ended.
	if fresh := scrapeMetrics(t, startServe(t, e)); fresh[tenantEgress] < after[eg] {
		t.Errorf("a new server's egress total for the tenant %.0f < the removed sandbox's %.0f", fresh[tenantEgress], after[eg])
	}
}
