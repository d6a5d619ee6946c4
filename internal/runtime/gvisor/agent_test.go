package gvisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// TestStageAgent: the agent is copied once into the directory under its
// digest, read-only; the same file is found again by its identity; a
// changed binary gets a copy of its own, and the first copy stays.
func TestStageAgent(t *testing.T) {
	dir, src := t.TempDir(), filepath.Join(t.TempDir(), "airlock-agent")
	if err := os.WriteFile(src, []byte("agent one"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum1, p1, err := stageAgent(dir, src)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "sha256-"+sum1); p1 != want || !validSum(sum1) {
		t.Fatalf("staged at %s (sum %q), want %s", p1, sum1, want)
	}
	if b, err := os.ReadFile(p1); err != nil || string(b) != "agent one" {
		t.Fatalf("the copy: %q %v", b, err)
	}
	if fi, err := os.Stat(p1); err != nil || fi.Mode().Perm() != 0o555 {
		t.Fatalf("the copy's mode: %v %v", fi, err)
	}
	links, _ := filepath.Glob(filepath.Join(dir, "by-stat", "*"))
	if len(links) != 1 {
		t.Fatalf("by-stat holds %v, want one link", links)
	}
	// The same file again: found by its identity, the same answer.
	if sum, p, err := stageAgent(dir, src); err != nil || sum != sum1 || p != p1 {
		t.Fatalf("second stage: %s %s %v", sum, p, err)
	}
	// A new binary at the same path (as `make build` writes one).
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte("agent two, longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum2, p2, err := stageAgent(dir, src)
	if err != nil || sum2 == sum1 || p2 == p1 {
		t.Fatalf("changed agent staged as %s %s %v", sum2, p2, err)
	}
	if _, err := os.Stat(p1); err != nil {
		t.Fatalf("the first copy went: %v", err)
	}
	// Without a directory the binary is used where it is.
	if sum, p, err := stageAgent("", src); err != nil || sum != sum2 || p != src {
		t.Fatalf("unstaged: %s %s %v", sum, p, err)
	}
	if _, _, err := stageAgent(dir, filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing agent was staged")
	}
}

// TestAgentFor: a restore binds the agent its state names: the runtime's
// own, a copy the directory keeps, or none (refused, saying why); a state
// that names none restores with the runtime's; a bad digest is refused.
func TestAgentFor(t *testing.T) {
	dir := t.TempDir()
	own := strings.Repeat("a", 64)
	kept := strings.Repeat("b", 64)
	if err := os.WriteFile(filepath.Join(dir, agentFile(kept)), []byte("old agent"), 0o555); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{cfg: Config{AgentDir: dir}, agent: filepath.Join(dir, agentFile(own)), agentSum: own}
	state := func(content string) string {
		d := t.TempDir()
		if content != "" {
			if err := os.WriteFile(filepath.Join(d, AgentStateFile), []byte(content), 0o444); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	for _, c := range []struct {
		name, restoreFrom, wantPath, wantErr string
	}{
		{"a new sandbox", "", r.agent, ""},
		{"saved with this agent", state(own + "\n"), r.agent, ""},
		{"saved with a kept one", state(kept + "\n"), filepath.Join(dir, agentFile(kept)), ""},
		{"saved before airlock recorded it", state(""), r.agent, ""},
		{"saved with one this host lacks", state(strings.Repeat("c", 64)), "", "saved with guest agent sha256:cccccccccccc, which this host does not have"},
		{"a bad digest", state("../../etc/passwd"), "", "no valid agent digest"},
	} {
		in := &instance{rt: r, spec: runtime.Spec{RestoreFrom: c.restoreFrom}}
		p, _, err := in.agentFor()
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || p != c.wantPath {
			t.Errorf("%s: %s %v, want %s", c.name, p, err, c.wantPath)
		}
	}
}

// TestRestoreKeepsItsAgent: a sandbox saved by one agent binary restores,
// after AgentPath changed, with the copy of the binary it ran (the bundle
// binds it, and the agent answers); a host without that copy refuses the
// restore. Without the copy the restored agent would read its unread pages
// from the new binary (it died: "fatal: morestack on gsignal").
func TestRestoreKeepsItsAgent(t *testing.T) {
	agents := t.TempDir()
	f := newFixture(t, func(c *Config) { c.AgentDir = agents })
	in, c := boot(t, f, f.spec(t))
	writeFile(t, c, "/root/marker", "saved")
	c.Close()
	saved := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(saved, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := in.SaveState(ctx, saved, runtime.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(saved, AgentStateFile)); err != nil || strings.TrimSpace(string(b)) != f.rt.agentSum {
		t.Fatalf("the state's agent: %q %v, want %s", b, err, f.rt.agentSum)
	}

	// Another agent binary at a new path: the first one's bytes and more.
	other := filepath.Join(t.TempDir(), "airlock-agent")
	b, err := os.ReadFile(f.rt.cfg.AgentPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, append(b, "another build"...), 0o755); err != nil {
		t.Fatal(err)
	}
	rt2, err := New(Config{RunscPath: f.rt.cfg.RunscPath, AgentPath: other, AgentDir: agents})
	if err != nil {
		t.Fatal(err)
	}
	if _, sum2, err := rt2.ownAgent(); err != nil || sum2 == f.rt.agentSum {
		t.Fatal("the second agent has the first one's digest")
	}
	f2 := &fixture{rt: rt2, rootfs: f.rootfs, base: f.base}
	rs := f2.spec(t)
	rs.RestoreFrom = saved
	rin, rc := boot(t, f2, rs)
	if r := run(t, rc, "", "cat", "/root/marker"); r.stdout != "saved" {
		t.Fatalf("after the restore: %+v", r)
	}
	var bundle struct {
		Mounts []struct{ Destination, Source string }
	}
	cfg, err := os.ReadFile(filepath.Join(rin.paths.bundle, "config.json"))
	if err != nil || json.Unmarshal(cfg, &bundle) != nil {
		t.Fatalf("the restore's bundle: %v", err)
	}
	bound := ""
	for _, m := range bundle.Mounts {
		if m.Destination == AgentPath {
			bound = m.Source
		}
	}
	if bound != f.rt.agent {
		t.Fatalf("the restore binds agent %q, want the saved one %q", bound, f.rt.agent)
	}

	// A host that never had the first agent refuses the restore.
	rt3, err := New(Config{RunscPath: f.rt.cfg.RunscPath, AgentPath: other, AgentDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	f3 := &fixture{rt: rt3, rootfs: f.rootfs, base: f.base}
	rs3 := f3.spec(t)
	rs3.RestoreFrom = saved
	ri, err := rt3.Create(t.Context(), rs3)
	if err != nil {
		t.Fatal(err)
	}
	if err := ri.Start(ctx); err == nil || !strings.Contains(err.Error(), "which this host does not have") {
		t.Fatalf("restore without the saved agent: %v", err)
	}
}

// TestPruneAgents: the copies a saved state names or a bundle binds stay,
// as does one staged within the grace period; the others go, with the
// by-stat links to them; what is freed is counted.
func TestPruneAgents(t *testing.T) {
	dir := t.TempDir()
	sum := func(c string) string { return strings.Repeat(c, 64) }
	old := time.Now().Add(-2 * time.Hour)
	for _, c := range []string{"a", "b", "c", "d"} {
		p := filepath.Join(dir, agentFile(sum(c)))
		if err := os.WriteFile(p, []byte("agent "+c), 0o555); err != nil {
			t.Fatal(err)
		}
		if c != "d" { // d: just staged
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "by-stat"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"a", "c"} {
		if err := os.Symlink(filepath.Join("..", agentFile(sum(c))), filepath.Join(dir, "by-stat", c)); err != nil {
			t.Fatal(err)
		}
	}
	// a: named by a saved state; b: bound by a running sandbox's bundle.
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, AgentStateFile), []byte(sum("a")+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	run := t.TempDir()
	if err := os.MkdirAll(filepath.Join(run, "bundle"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := `{"mounts":[{"destination":"/tmp","source":"tmpfs"},{"destination":"` + AgentPath + `","source":"` + filepath.Join(dir, agentFile(sum("b"))) + `"}]}`
	if err := os.WriteFile(filepath.Join(run, "bundle", "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	use := AgentsInUse([]string{state, t.TempDir()}, []string{run, t.TempDir()})
	if len(use) != 2 || !use[sum("a")] || !use[sum("b")] {
		t.Fatalf("in use: %v", use)
	}
	freed, err := PruneAgents(dir, use, time.Hour)
	if err != nil || freed != int64(len("agent c")) {
		t.Fatalf("freed %d, %v", freed, err)
	}
	for c, want := range map[string]bool{"a": true, "b": true, "c": false, "d": true} {
		if _, err := os.Stat(filepath.Join(dir, agentFile(sum(c)))); (err == nil) != want {
			t.Errorf("copy %s kept = %v, want %v", c, err == nil, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "by-stat", "c")); err == nil {
		t.Error("the link to the removed copy stayed")
	}
	if _, err := os.Lstat(filepath.Join(dir, "by-stat", "a")); err != nil {
		t.Errorf("the link to a kept copy went: %v", err)
	}
	if n, err := PruneAgents(filepath.Join(dir, "none"), nil, 0); n != 0 || err != nil {
		t.Fatalf("a missing directory: %d %v", n, err)
	}
}
