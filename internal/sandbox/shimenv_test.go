package sandbox

import (
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/envknob"
	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// TestShimEnvDropsSecretsAndKnobs: a shim starts without the caller's own
// copies of secret values and without the environment knobs, whose values
// travel in its configuration document.
func TestShimEnvDropsSecretsAndKnobs(t *testing.T) {
	t.Parallel()
	environ := []string{"PATH=/usr/bin", "API_KEY=s3cr3t", "HOME=/root"}
	for _, k := range envknob.All() {
		environ = append(environ, k.Setting("x"))
	}
	got := shimEnv(environ, netconf.Values{"API_KEY": "s3cr3t"})
	if want := []string{"PATH=/usr/bin", "HOME=/root"}; !slices.Equal(got, want) {
		t.Fatalf("shim env %q, want %q", got, want)
	}
	if len(environ) != 3+len(envknob.All()) || environ[1] != "API_KEY=s3cr3t" {
		t.Fatalf("shimEnv changed its argument: %q", environ)
	}
}
