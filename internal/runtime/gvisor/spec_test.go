package gvisor

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

func TestBuildSpec(t *testing.T) {
	t.Parallel()
	spec := runtime.Spec{ID: "a", CPUs: 2, MemoryMiB: 512, RootDisk: "/images/dirs/x", RunDir: "/run/x"}
	b, err := buildSpec(spec, bundleSpec{agent: "/bin/airlock-agent", netnsPath: "/run/netns/c", cgroupsPath: "/airlock-gvisor/c"})
	if err != nil {
		t.Fatal(err)
	}
	var s ociSpec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	switch {
	case s.Root.Path != spec.RootDisk || s.Root.Readonly:
		t.Errorf("root = %+v: want the image dir, readonly false (else runsc applies no overlay)", s.Root)
	case !slices.Equal(s.Process.Args, []string{AgentPath, "-container"}):
		t.Errorf("args = %q", s.Process.Args)
	case s.Linux.Resources == nil || s.Linux.Resources.Memory.Limit != 512<<20 || s.Linux.Resources.CPU.Quota != 200_000:
		t.Errorf("resources = %+v", s.Linux.Resources)
	case s.Linux.CgroupsPath != "/airlock-gvisor/c":
		t.Errorf("cgroups path = %q", s.Linux.CgroupsPath)
	}
	if i := slices.IndexFunc(s.Linux.Namespaces, func(n ociNamespace) bool { return n.Type == "network" }); i < 0 || s.Linux.Namespaces[i].Path != "/run/netns/c" {
		t.Errorf("network namespace: %+v", s.Linux.Namespaces)
	}
	i := slices.IndexFunc(s.Mounts, func(m ociMount) bool { return m.Destination == AgentPath })
	if i < 0 || s.Mounts[i].Source != "/bin/airlock-agent" || !slices.Contains(s.Mounts[i].Options, "ro") {
		t.Errorf("agent mount: %+v", s.Mounts)
	}
	for _, m := range s.Mounts {
		if !slices.ContainsFunc(MountPoints, func(p MountPoint) bool { return p.Path == m.Destination }) {
			t.Errorf("mount %s is not in MountPoints: runsc would create it in the shared tree", m.Destination)
		}
	}

	// No cgroups: no limits in the spec.
	b, _ = buildSpec(spec, bundleSpec{agent: "/a"})
	if strings.Contains(string(b), "resources") || strings.Contains(string(b), "cgroupsPath") {
		t.Errorf("spec without cgroups has limits: %s", b)
	}
}

func TestRunscArgs(t *testing.T) {
	t.Parallel()
	p := instancePaths{root: "/r/runsc", bundle: "/r/bundle", upper: "/r/upper", logDir: "/r/logs"}
	got := strings.Join(runscArgs(Config{Platform: "systrap", DiskBytes: 1 << 30}, p, "cid", runtime.Spec{Network: true}), " ")
	want := "--root=/r/runsc --platform=systrap --network=sandbox --overlay2=root:dir=/r/upper,size=1073741824 --cpu-num-from-quota --in-sandbox-cgroup=v2 run --bundle /r/bundle cid"
	if got != want {
		t.Errorf("args:\n got %s\nwant %s", got, want)
	}
	got = strings.Join(runscArgs(Config{Platform: "systrap", IgnoreCgroups: true}, p, "cid", runtime.Spec{}), " ")
	if !strings.Contains(got, "--network=none") || !strings.Contains(got, "--overlay2=root:dir=/r/upper ") || !strings.Contains(got, "--ignore-cgroups") {
		t.Errorf("args: %s", got)
	}
	// A template build's root is written in place: no overlay, and no
	// size (the build's own filesystem caps it).
	got = strings.Join(runscArgs(Config{Platform: "systrap", DiskBytes: 1 << 30}, p, "cid", runtime.Spec{RootInPlace: true}), " ")
	if !strings.Contains(got, "--overlay2=none ") || strings.Contains(got, "size=") {
		t.Errorf("args in place: %s", got)
	}
	// Process audit: the trace session's config, before the command.
	p.monitor = "/r/monitor"
	got = strings.Join(runscArgs(Config{Platform: "systrap"}, p, "cid", runtime.Spec{}), " ")
	if !strings.HasSuffix(got, " --pod-init-config=/r/monitor/init.json run --bundle /r/bundle cid") {
		t.Errorf("args with process audit: %s", got)
	}
	// A restore: the same flags, the saved image instead of a run.
	got = strings.Join(runscArgs(Config{Platform: "systrap"}, p, "cid", runtime.Spec{Network: true, RestoreFrom: "/p/state"}), " ")
	if !strings.HasSuffix(got, " restore --image-path=/p/state --bundle /r/bundle cid") || !strings.Contains(got, "--network=sandbox") {
		t.Errorf("args of a restore: %s", got)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{RunscPath: "/usr/local/bin/runsc"}); err == nil {
		t.Error("New without an agent path succeeded")
	}
	rt, err := New(Config{RunscPath: "/x/runsc", AgentPath: "/x/agent"})
	if err != nil {
		t.Fatal(err)
	}
	if rt.Name() != "gvisor" {
		t.Error(rt.Name())
	}
	_, err = rt.Create(t.Context(), runtime.Spec{ID: "a", CPUs: 1, MemoryMiB: 64, Kernel: "k", Initrd: "i", RootDisk: "/d", RunDir: "/r", RestoreFrom: "s"})
	if err == nil {
		t.Error("Create with a relative RestoreFrom succeeded")
	}
}
