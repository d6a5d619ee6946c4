package qemu

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func goldenSpec() runtime.Spec {
	return runtime.Spec{
		ID:         "sbx-0123",
		CPUs:       1,
		MemoryMiB:  256,
		Kernel:     "/var/lib/airlock/kernels/vmlinux-6.1",
		Initrd:     "/var/lib/airlock/kernels/initrd-agent.gz",
		KernelArgs: []string{"airlock.hostname=sbx"},
		RootDisk:   "/var/lib/airlock/sandboxes/sbx-0123/root.qcow2",
		RunDir:     "/run/airlock/sbx-0123",
	}
}

func TestBuildArgsGolden(t *testing.T) {
	tcg := argConfig{Accel: "tcg", TSCkHz: 2599996}
	disk := fdLayout{Disk: true}
	cases := []struct {
		name string
		cfg  argConfig
		spec func(*runtime.Spec)
		fds  fdLayout
	}{
		{"cold-tcg", tcg, nil, disk},
		{"cold-kvm", argConfig{Accel: "kvm", TSCkHz: 2599996}, func(s *runtime.Spec) { s.CPUs = 2; s.MemoryMiB = 1024 }, disk},
		{"raw-disk", tcg, func(s *runtime.Spec) { s.RootDiskFormat = "raw" }, disk},
		{"template", tcg, func(s *runtime.Spec) { s.Snapshottable, s.Network = true, true }, fdLayout{Disk: true, Mem: true, MemShare: true, Net: true}},
		{"restore", tcg, func(s *runtime.Spec) { s.RestoreFrom, s.Network = "/var/lib/airlock/templates/t1", true }, fdLayout{Disk: true, Mem: true, Incoming: true, Net: true}},
		{"restore-full", tcg, func(s *runtime.Spec) { s.RestoreFrom, s.Network = "/var/lib/airlock/sandboxes/sbx-0123/pause", true }, fdLayout{Disk: true, Incoming: true, Net: true}},
		{"restore-full-snapshottable", tcg, func(s *runtime.Spec) {
			s.RestoreFrom, s.Snapshottable = "/var/lib/airlock/sandboxes/sbx-0123/pause", true
		}, fdLayout{Disk: true, Mem: true, MemShare: true, Incoming: true}},
		{"cold-net", tcg, func(s *runtime.Spec) { s.Network = true }, fdLayout{Disk: true, Net: true}},
		// A pause snapshot from before machine profiles: PIT on, no ARAT.
		{"restore-full-legacy", argConfig{Accel: "tcg", TSCkHz: 2599996, Legacy: true}, func(s *runtime.Spec) {
			s.RestoreFrom, s.Network = "/var/lib/airlock/sandboxes/sbx-0123/pause", true
		}, fdLayout{Disk: true, Incoming: true, Net: true}},
		{"volumes", tcg, func(s *runtime.Spec) {
			s.Network = true
			s.Mounts = []runtime.Mount{
				{Image: "/var/lib/airlock/volumes/vol-a.img", Target: "/data"},
				{Image: "/var/lib/airlock/volumes/vol-b.img", Target: "/ref", ReadOnly: true},
			}
		}, fdLayout{Disk: true, Net: true}},
		{"probe", argConfig{Accel: "kvm", Probe: true}, func(s *runtime.Spec) { s.ID = "probe,x"; s.RootDisk = ""; s.KernelArgs = nil }, fdLayout{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := goldenSpec()
			if c.spec != nil {
				c.spec(&spec)
			}
			got := strings.Join(buildArgs(c.cfg, spec, c.fds), "\n") + "\n"
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got != string(want) {
				t.Errorf("argv differs from %s (go test -update to accept):\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// A template and its clone must have the same devices in the same order;
// only backends may differ (notes §5).
func TestTemplateAndCloneDeviceOrder(t *testing.T) {
	cfg := argConfig{Accel: "tcg", TSCkHz: 1}
	tmpl := goldenSpec()
	tmpl.Snapshottable, tmpl.Network = true, true
	clone := goldenSpec()
	clone.RestoreFrom, clone.Network = "/t", true
	devices := func(argv []string) []string {
		var d []string
		for i, a := range argv {
			if a == "-device" || a == "-netdev" || a == "-M" || a == "-m" || a == "-smp" || a == "-cpu" || a == "-accel" {
				d = append(d, a+" "+argv[i+1])
			}
		}
		return d
	}
	a := devices(buildArgs(cfg, tmpl, fdLayout{Disk: true, Mem: true, MemShare: true, Net: true}))
	b := devices(buildArgs(cfg, clone, fdLayout{Disk: true, Mem: true, Incoming: true, Net: true}))
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Fatalf("device sets differ:\n%v\n%v", a, b)
	}
	// A SaveState stream may come from a cold boot, a clone or a template
	// and go to an anonymous-RAM or a Snapshottable restore: all have the
	// same devices and a RAM backend named "mem".
	cold := goldenSpec()
	cold.Network = true
	for _, fds := range []fdLayout{
		{Disk: true, Net: true},
		{Disk: true, Incoming: true, Net: true},
		{Disk: true, Mem: true, MemShare: true, Incoming: true, Net: true},
	} {
		argv := buildArgs(cfg, cold, fds)
		if c := devices(argv); strings.Join(c, "\n") != strings.Join(a, "\n") {
			t.Errorf("%+v: device set differs:\n%v\n%v", fds, c, a)
		}
		if !slices.ContainsFunc(argv, func(s string) bool { return strings.HasPrefix(s, "memory-backend-") && strings.Contains(s, ",id=mem,") }) {
			t.Errorf("%+v: no RAM backend with id mem: %v", fds, argv)
		}
	}
}

func TestKernelCmdline(t *testing.T) {
	s := goldenSpec()
	if got := kernelCmdline(argConfig{Accel: "tcg", TSCkHz: 2700000}, s); got != "console=ttyS0 quiet panic=-1 nowatchdog sysctl.vm.compaction_proactiveness=0 tsc_early_khz=2700000 tsc=reliable highres=off airlock.hostname=sbx" {
		t.Errorf("tcg: %q", got)
	}
	if got := kernelCmdline(argConfig{Accel: "kvm", TSCkHz: 2700000}, s); got != "console=ttyS0 quiet panic=-1 nowatchdog sysctl.vm.compaction_proactiveness=0 airlock.hostname=sbx" {
		t.Errorf("kvm: %q", got)
	}
}
