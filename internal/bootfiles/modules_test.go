package bootfiles

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestModuleName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"virtio-rng.ko":                      "virtio_rng",
		"kernel/drivers/virtio/virtio.ko.xz": "virtio",
		"9pnet_virtio.ko.zst":                "9pnet_virtio",
		"net_failover":                       "net_failover",
		"kernel/fs/ext4/ext4.ko":             "ext4",
	} {
		if got := moduleName(in); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOrderModules(t *testing.T) {
	t.Parallel()
	deps := map[string][]string{
		"virtio_ring":    nil,
		"virtio":         {"virtio_ring"},
		"virtio_mmio":    {"virtio", "virtio_ring"},
		"virtio_blk":     {"virtio", "virtio_ring"},
		"virtio_net":     {"virtio_ring", "virtio", "net_failover"},
		"net_failover":   {"failover"},
		"failover":       nil,
		"9p":             {"9pnet", "netfs", "fscache"},
		"netfs":          nil,
		"fscache":        {"netfs"},
		"9pnet":          nil,
		"uses_builtin":   {"ext4"},
		"cycle_a":        {"cycle_b"},
		"cycle_b":        {"cycle_a"},
		"virtio_console": {"virtio", "virtio_ring"},
	}
	builtin := func(n string) bool { return n == "ext4" }
	lookup := func(n string) ([]string, error) {
		d, ok := deps[n]
		if !ok {
			t.Fatalf("unexpected lookup of %q", n)
		}
		return d, nil
	}

	got, err := orderModules([]string{"virtio_mmio", "virtio-blk", "virtio_net", "virtio_console", "ext4", "uses_builtin", "9p"}, builtin, lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "failover", "net_failover", "virtio_net", "virtio_console", "uses_builtin", "9pnet", "netfs", "fscache", "9p"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order:\n got %v\nwant %v", got, want)
	}
	// Every module comes after all of its dependencies.
	pos := map[string]int{}
	for i, n := range got {
		pos[n] = i
	}
	for _, n := range got {
		for _, d := range deps[n] {
			if builtin(d) {
				continue
			}
			if pos[d] >= pos[n] {
				t.Errorf("%s loads before its dependency %s", n, d)
			}
		}
	}

	if _, err := orderModules([]string{"cycle_a"}, builtin, lookup); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("cycle: err = %v", err)
	}
}

func TestParseModinfo(t *testing.T) {
	t.Parallel()
	ko := buildELF(t, fakeELF{typ: 1, modinfo: modinfoBytes(
		"license=GPL", "depends=virtio_ring,virtio,net-failover", "name=virtio_net",
		"vermagic=6.1.0-56-cloud-amd64 SMP preempt mod_unload modversions ")})
	mi, err := parseModinfo(ko)
	if err != nil {
		t.Fatal(err)
	}
	if mi.name != "virtio_net" || !reflect.DeepEqual(mi.depends, []string{"virtio_ring", "virtio", "net_failover"}) ||
		!strings.HasPrefix(mi.vermagic, "6.1.0-56-cloud-amd64 ") {
		t.Fatalf("modinfo = %+v", mi)
	}
	mi, err = parseModinfo(buildELF(t, fakeELF{typ: 1, modinfo: modinfoBytes("depends=", "name=virtio_ring")}))
	if err != nil || len(mi.depends) != 0 {
		t.Fatalf("empty depends: %+v, %v", mi, err)
	}
	if _, err := parseModinfo(buildELF(t, fakeELF{typ: 1})); err == nil {
		t.Fatal("module without .modinfo accepted")
	}
}

func TestParseBuiltin(t *testing.T) {
	t.Parallel()
	m := parseBuiltin([]byte("kernel/fs/ext4/ext4.ko\nkernel/lib/crc16.ko\n\nkernel/drivers/char/hw_random/rng-core.ko\n"))
	for _, n := range []string{"ext4", "crc16", "rng_core"} {
		if !m[n] {
			t.Errorf("%s not builtin", n)
		}
	}
	if m["virtio"] {
		t.Error("virtio reported builtin")
	}
}

// fakeModuleTree writes a lib/modules/<release> tree with the given modules
// (name -> depends) and builtin list, and returns its path.
func fakeModuleTree(t testing.TB, release string, mods map[string]string, builtin ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "lib", "modules", release)
	for name, deps := range mods {
		file := strings.ReplaceAll(name, "_", "-") + ".ko" // like virtio-rng.ko
		if name == "virtio" || name == "virtio_ring" {
			file = name + ".ko"
		}
		p := filepath.Join(dir, "kernel", "drivers", "fake", file)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		ko := buildELF(t, fakeELF{typ: 1, modinfo: modinfoBytes("name="+name, "depends="+deps, "vermagic="+release+" SMP mod_unload ")})
		if err := os.WriteFile(p, ko, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var b strings.Builder
	for _, n := range builtin {
		b.WriteString("kernel/fs/" + n + "/" + n + ".ko\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cloudTree is a fake tree with the modules Modules(FlavorCloud) needs.
var cloudTree = map[string]string{
	"virtio_ring": "", "virtio": "virtio_ring", "virtio_mmio": "virtio,virtio_ring",
	"virtio_console": "virtio,virtio_ring", "virtio_blk": "virtio,virtio_ring",
	"virtio_rng": "virtio,virtio_ring", "virtio_net": "virtio_ring,virtio,net_failover",
	"net_failover": "failover", "failover": "", "fuse": "", "virtiofs": "fuse,virtio,virtio_ring",
	"9pnet": "", "9pnet_virtio": "9pnet,virtio,virtio_ring", "9p": "9pnet,netfs", "netfs": "",
}

func TestResolveModules(t *testing.T) {
	t.Parallel()
	const release = "6.1.0-99-cloud-amd64"
	dir := fakeModuleTree(t, release, cloudTree, "overlay", "ext4")
	mods, err := resolveModules(t.Context(), dir, release, Modules(FlavorCloud))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.name)
		if mi, err := parseModinfo(m.data); err != nil || mi.name != m.name {
			t.Errorf("%s: data is not its module: %+v %v", m.name, mi, err)
		}
	}
	want := []string{"virtio_ring", "virtio", "virtio_mmio", "virtio_console", "virtio_blk", "virtio_rng",
		"failover", "net_failover", "virtio_net", "fuse", "virtiofs"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("modules:\n got %v\nwant %v", names, want)
	}

	mods, err = resolveModules(t.Context(), dir, release, Modules(FlavorGeneric))
	if err != nil {
		t.Fatal(err)
	}
	if got := mods[len(mods)-1].name; got != "9p" {
		t.Fatalf("generic: last module %s, want 9p", got)
	}

	if _, err := resolveModules(t.Context(), dir, "6.1.0-1-other", []string{"virtio"}); err == nil || !strings.Contains(err.Error(), "vermagic") {
		t.Fatalf("vermagic mismatch: err = %v", err)
	}
	if _, err := resolveModules(t.Context(), dir, release, []string{"no_such_module"}); err == nil {
		t.Fatal("missing module accepted")
	}
}
