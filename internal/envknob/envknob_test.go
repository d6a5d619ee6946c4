package envknob

import (
	"strings"
	"testing"
)

func TestKnobs(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range All() {
		if !strings.HasPrefix(k.Name, "AIRLOCK_") || k.Doc == "" {
			t.Errorf("knob %+v: want an AIRLOCK_ name and a doc", k)
		}
		if seen[k.Name] {
			t.Errorf("knob %s registered twice", k.Name)
		}
		seen[k.Name] = true
		if k.TestHook != strings.HasPrefix(k.Name, "AIRLOCK_TEST_") {
			t.Errorf("knob %s: test hooks and only they are named AIRLOCK_TEST_*", k.Name)
		}
	}
	t.Setenv(TestDialMap.Name, "192.0.2.1=127.0.0.1")
	if v, ok := TestDialMap.Lookup(); !ok || v != "192.0.2.1=127.0.0.1" || TestDialMap.Get() != v {
		t.Errorf("Lookup = %q, %v", v, ok)
	}
	if got := DNS.Setting("127.0.0.1:53"); got != "AIRLOCK_DNS=127.0.0.1:53" {
		t.Errorf("Setting = %q", got)
	}
}
