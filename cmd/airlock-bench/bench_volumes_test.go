package main

import (
	"os/exec"
	"strings"
	"testing"
)

func ptr(f float64) *float64 { return &f }

func TestParseFSResult(t *testing.T) {
	t.Parallel()
	good := `{"mib": 8, "files": 20, "write_mbps": 100.5, "read_mbps": 400, "reread_mbps": 4000, "fadvise": "ok", "resident": 0.0, "creates_per_s": 2000}`
	r, err := parseFSResult("a warning on stdout\n"+good+"\n", 8, 20)
	if err != nil {
		t.Fatal(err)
	}
	if r.WriteMBps != 100.5 || r.ReadMBps != 400 || r.RereadMBps != 4000 || r.CreatesPerS != 2000 || r.Fadvise != "ok" || r.Resident == nil || *r.Resident != 0 {
		t.Errorf("parsed %+v", r)
	}
	if r, err := parseFSResult(strings.Replace(good, `"resident": 0.0`, `"resident": null`, 1), 8, 20); err != nil || r.Resident != nil {
		t.Errorf("resident null: %+v, %v", r, err)
	}
	for name, bad := range map[string]string{
		"not json":       "Traceback (most recent call last):",
		"empty":          "",
		"other size":     strings.Replace(good, `"mib": 8`, `"mib": 4`, 1),
		"other files":    strings.Replace(good, `"files": 20`, `"files": 2`, 1),
		"zero write":     strings.Replace(good, `"write_mbps": 100.5`, `"write_mbps": 0`, 1),
		"negative read":  strings.Replace(good, `"read_mbps": 400`, `"read_mbps": -1`, 1),
		"missing reread": strings.Replace(good, `"reread_mbps": 4000, `, ``, 1),
		"NaN creates":    strings.Replace(good, `"creates_per_s": 2000`, `"creates_per_s": NaN`, 1),
		"resident > 1":   strings.Replace(good, `"resident": 0.0`, `"resident": 1.5`, 1),
	} {
		if r, err := parseFSResult(bad, 8, 20); err == nil {
			t.Errorf("%s: parsed %+v, want an error", name, r)
		}
	}
}

func TestReadCache(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r    fsResult
		want string
	}{
		{fsResult{Fadvise: "ok", Resident: ptr(0)}, "cold"},
		{fsResult{Fadvise: "ok", Resident: ptr(0.01)}, "cold"},
		{fsResult{Fadvise: "ok", Resident: ptr(1)}, "cached"},
		{fsResult{Fadvise: "ok", Resident: ptr(0.5)}, "50% cached"},
		{fsResult{Fadvise: "ok"}, "cold or cached: unknown"},
		{fsResult{Fadvise: "error: Invalid argument", Resident: ptr(0)}, "page cache not dropped (fadvise error: Invalid argument)"},
	} {
		if got := c.r.readCache(); got != c.want {
			t.Errorf("%+v: readCache() = %q, want %q", c.r, got, c.want)
		}
	}
}

func TestBestOf(t *testing.T) {
	t.Parallel()
	a := fsResult{WriteMBps: 10, ReadMBps: 50, RereadMBps: 500, CreatesPerS: 900, Fadvise: "ok", Resident: ptr(0)}
	b := fsResult{WriteMBps: 20, ReadMBps: 40, RereadMBps: 600, CreatesPerS: 800, Fadvise: "ok", Resident: ptr(0.3)}
	got := bestOf([]fsResult{a, b})
	if got.WriteMBps != 20 || got.ReadMBps != 50 || got.RereadMBps != 600 || got.CreatesPerS != 900 {
		t.Errorf("bestOf = %+v: want the best of each figure", got)
	}
	if got.Resident == nil || *got.Resident != 0.3 {
		t.Errorf("bestOf resident = %v: want the largest (0.3)", got.Resident)
	}
	if got := bestOf([]fsResult{a}); got.WriteMBps != 10 || *got.Resident != 0 {
		t.Errorf("bestOf of one = %+v", got)
	}
	c := b
	c.Resident, c.Fadvise = nil, "error: x"
	if got := bestOf([]fsResult{a, c}); got.Resident != nil || got.Fadvise != "error: x" {
		t.Errorf("bestOf with an unknown residency and a failed fadvise = %+v: want both kept", got)
	}
}

func TestRatios(t *testing.T) {
	t.Parallel()
	host := fsResult{WriteMBps: 400, ReadMBps: 800, RereadMBps: 4000, CreatesPerS: 20000}
	guest := fsResult{WriteMBps: 100, ReadMBps: 1000, RereadMBps: 2000, CreatesPerS: 1000}
	q := ratios(guest, host)
	if q != (fsRatios{write: 0.25, read: 1.25, reread: 0.5, creates: 0.05}) {
		t.Errorf("ratios = %+v", q)
	}
	if got, want := q.String(), "0.25x / 1.25x / 0.50x / 0.05x"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestVolbenchScript runs the workload with the host's python3 on a small
// size and checks that what it prints parses.
func TestVolbenchScript(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("no python3 on PATH (scripts/deps.sh installs it): the volume workload is a Python 3 script")
	}
	dir := t.TempDir()
	r, err := hostRun(t.Context(), dir, 4, 10)
	if err != nil {
		t.Fatal(err)
	}
	if r.Fadvise != "ok" {
		t.Errorf("fadvise on the host: %q", r.Fadvise)
	}
	if m, _ := exec.Command("find", dir, "-type", "f").Output(); len(m) != 0 {
		t.Errorf("the workload left files behind: %s", m)
	}
}
