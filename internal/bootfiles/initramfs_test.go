package bootfiles

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cavaliergopher/cpio"
)

type cpioEntry struct {
	hdr  cpio.Header
	data []byte
}

func readCPIO(t testing.TB, path string) map[string]cpioEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := cpio.NewReader(f)
	m := map[string]cpioEntry{}
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := m[h.Name]; dup {
			t.Errorf("duplicate entry %s", h.Name)
		}
		m[h.Name] = cpioEntry{*h, data}
	}
	return m
}

func fakeKernel(t testing.TB, flavor string) Kernel {
	const release = "6.1.0-99-cloud-amd64"
	return Kernel{
		Flavor: flavor, Release: release,
		ModulesDir: fakeModuleTree(t, release, cloudTree, "ext4", "overlay"),
	}
}

func writeAgent(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent")
	b := buildELF(t, fakeELF{padding: len(content)})
	b = append(b, content...)
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuildInitramfs(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	k := fakeKernel(t, FlavorCloud)
	agentPath := writeAgent(t, "agent v1")
	agent, _ := os.ReadFile(agentPath)

	p, err := BuildInitramfs(t.Context(), state, k, agentPath)
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(p) || filepath.Dir(p) != mustAbs(t, filepath.Join(state, "initramfs")) || !strings.HasSuffix(p, ".cpio") {
		t.Fatalf("path %s", p)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o444 {
		t.Fatalf("stat: %v %v", fi.Mode(), err)
	}

	m := readCPIO(t, p)
	init, ok := m["init"]
	if !ok || !bytes.Equal(init.data, agent) || init.hdr.Mode != cpio.TypeReg|0o755 || init.hdr.Uid != 0 {
		t.Fatalf("init entry: %+v (ok=%v)", init.hdr, ok)
	}
	for _, d := range []string{"dev", "proc", "sys", "tmp", "newroot", "mods"} {
		if e, ok := m[d]; !ok || e.hdr.Mode&cpio.ModeType != cpio.TypeDir {
			t.Errorf("dir %s missing or not a dir: %+v", d, e.hdr)
		}
	}
	if e := m["dev/console"]; e.hdr.Mode != cpio.TypeChar|0o600 {
		t.Errorf("dev/console: mode %o", e.hdr.Mode)
	}
	order := strings.Fields(string(m["mods/order"].data))
	want := []string{"virtio_ring.ko", "virtio.ko", "virtio_mmio.ko", "virtio_console.ko", "virtio_blk.ko", "virtio_rng.ko",
		"failover.ko", "net_failover.ko", "virtio_net.ko", "fuse.ko", "virtiofs.ko"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("order:\n got %v\nwant %v", order, want)
	}
	for _, name := range order {
		e, ok := m["mods/"+name]
		if !ok {
			t.Fatalf("mods/%s missing", name)
		}
		mi, err := parseModinfo(e.data)
		if err != nil || mi.name+".ko" != name {
			t.Errorf("mods/%s: %+v %v", name, mi, err)
		}
	}
	if _, ok := m["mods/ext4.ko"]; ok {
		t.Error("built-in ext4 packed as a module")
	}

	// Same inputs: same file, not rewritten.
	before, _ := os.Stat(p)
	p2, err := BuildInitramfs(t.Context(), state, k, agentPath)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(p2)
	if p2 != p || !os.SameFile(before, after) {
		t.Fatalf("rebuilt for identical inputs: %s vs %s", p, p2)
	}

	// New agent: new archive.
	p3, err := BuildInitramfs(t.Context(), state, k, writeAgent(t, "agent v2"))
	if err != nil {
		t.Fatal(err)
	}
	if p3 == p {
		t.Fatal("agent change did not change the archive")
	}

	// Generic flavor: more modules, another archive.
	kg := k
	kg.Flavor = FlavorGeneric
	p4, err := BuildInitramfs(t.Context(), state, kg, agentPath)
	if err != nil {
		t.Fatal(err)
	}
	if p4 == p {
		t.Fatal("flavor change did not change the archive")
	}
	if !strings.HasSuffix(string(readCPIO(t, p4)["mods/order"].data), "9pnet.ko\n9pnet_virtio.ko\nnetfs.ko\n9p.ko\n") {
		t.Fatalf("generic order: %q", readCPIO(t, p4)["mods/order"].data)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(state, "initramfs", tmpDirPrefix+"*")); len(leftovers) != 0 {
		t.Fatalf("temp files left: %v", leftovers)
	}
}

func TestBuildInitramfsRejectsBadAgent(t *testing.T) {
	t.Parallel()
	k := fakeKernel(t, FlavorCloud)
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dynamic := filepath.Join(dir, "dynamic")
	if err := os.WriteFile(dynamic, buildELF(t, fakeELF{interp: "/lib64/ld-linux-x86-64.so.2"}), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{script, dynamic, filepath.Join(dir, "missing")} {
		if _, err := BuildInitramfs(t.Context(), t.TempDir(), k, p); err == nil {
			t.Errorf("%s accepted as agent", filepath.Base(p))
		}
	}
}

func TestWriteInitramfsDeterministic(t *testing.T) {
	t.Parallel()
	mods := []module{{"a", []byte("AAAA")}, {"b", []byte("B")}}
	var x, y bytes.Buffer
	if err := writeInitramfs(&x, []byte("agent"), mods); err != nil {
		t.Fatal(err)
	}
	if err := writeInitramfs(&y, []byte("agent"), mods); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x.Bytes(), y.Bytes()) || x.Len()%4 != 0 {
		t.Fatalf("archives differ or are misaligned (%d bytes)", x.Len())
	}
	// The hand-written /dev/console header carries device 5:1.
	i := bytes.Index(x.Bytes(), []byte("dev/console\x00"))
	hdr := x.Bytes()[i-110 : i]
	if got := string(hdr[78:94]); got != "0000000500000001" {
		t.Fatalf("dev/console rdev fields = %q", got)
	}
	if err := writeInitramfs(io.Discard, []byte("agent"), []module{{"../x", nil}}); err == nil {
		t.Fatal("bad module name accepted")
	}
}

func mustAbs(t testing.TB, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
