package e2e

import (
	"strings"
	"testing"
)

// TestGVisorRuntime: the same CLI on the gvisor runtime (runsc, installed
// by `make test`'s deps): the guest is gVisor, exit codes, streams and
// stdin work, and sandboxes are isolated. (The network tests run on
// gvisor too: TestNetworkOnGVisor.)
func TestGVisorRuntime(t *testing.T) {
	e := setup(t)
	gv := func(args ...string) []string { return append([]string{"--runtime", "gvisor"}, args...) }
	r := e.run(t, nil, gv("run", "--", "python3", "-c", "import platform; print(6*7, platform.release())")...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "42 ") || !strings.Contains(r.stdout, "gvisor") {
		t.Fatalf("run: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	a := strings.TrimSpace(e.must(t, gv("create")...))
	t.Cleanup(func() { e.run(t, nil, "rm", a) })
	b := strings.TrimSpace(e.must(t, gv("create")...))
	t.Cleanup(func() { e.run(t, nil, "rm", b) })
	// The sandbox keeps its runtime; later commands need no flag.
	if st := inspect(t, e, a); st.Runtime != "gvisor" || st.State != "running" {
		t.Fatalf("inspect: %+v", st)
	}
	if r := e.run(t, nil, "exec", a, "--", "sh", "-c", "echo out; echo err >&2; exit 3"); r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exec: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := e.run(t, strings.NewReader("from stdin"), "exec", "-i", a, "--", "cat"); r.stdout != "from stdin" {
		t.Errorf("stdin: %q", r.stdout)
	}
	e.must(t, "exec", a, "--", "sh", "-c", "echo secret-of-a > /root/a.txt")
	if r := e.run(t, nil, "exec", b, "--", "cat", "/root/a.txt"); r.code == 0 {
		t.Errorf("sandbox b reads a's file: %q", r.stdout)
	}
}

// TestAutoRuntime: --runtime auto gives new sandboxes the runtime doctor
// names, and without usable KVM that is gvisor (runsc is installed by
// make test).
func TestAutoRuntime(t *testing.T) {
	e := setup(t)
	doc := e.run(t, nil, "--runtime", "auto", "doctor").stdout
	var picked, accel string
	for line := range strings.Lines(doc) {
		f := strings.Fields(line)
		switch {
		case len(f) > 3 && f[0] == "runtime" && f[1] == "ok":
			picked = f[2]
		case len(f) > 2 && f[0] == "acceleration":
			accel = f[2]
		}
	}
	if picked != "qemu" && picked != "gvisor" || accel == "" {
		t.Fatalf("doctor names no runtime or acceleration:\n%s", doc)
	}
	if accel != "kvm:" && picked != "gvisor" {
		t.Fatalf("no usable KVM, yet auto picks %s:\n%s", picked, doc)
	}
	id := strings.TrimSpace(e.must(t, "--runtime", "auto", "create"))
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	if st := inspect(t, e, id); st.Runtime != picked {
		t.Fatalf("auto created a %s sandbox; doctor said %s", st.Runtime, picked)
	}
}
