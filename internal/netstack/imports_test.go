package netstack

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOnlyNetstackImportsGVisor keeps gVisor behind this package (STYLE.md):
// no other package in the module may depend on it, directly or not, except
// through internal/netstack. The one other importer is
// internal/runtime/gvisor/monitor (and its test helper), for the protobuf
// types and wire header of gVisor's runtime monitoring, the protocol that
// runsc speaks to it: no gVisor type crosses its API either.
const monitorPkg = "github.com/airlock-sandbox/airlock/internal/runtime/gvisor/monitor"

func TestOnlyNetstackImportsGVisor(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/airlock-sandbox/airlock/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		checked++
		if f[0] == "github.com/airlock-sandbox/airlock/internal/netstack" || strings.HasPrefix(f[0], "github.com/airlock-sandbox/airlock/internal/netstack/") {
			continue
		}
		if f[0] == monitorPkg || strings.HasPrefix(f[0], monitorPkg+"/") {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, "gvisor.dev/") {
				t.Errorf("%s imports %s; only internal/netstack may import gVisor", f[0], imp)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("go list returned only %d packages", checked)
	}
}
