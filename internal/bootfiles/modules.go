package bootfiles

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Modules the agent loads at boot, by flavor, before their dependencies are
// added. The cloud kernel builds ext4 in; everything virtio is a module.
var (
	cloudModules = []string{
		"virtio_ring", "virtio", "virtio_mmio", // transport
		"virtio_console", // agent channel (virtio-serial)
		"virtio_blk",     // root disk
		"virtio_rng",     // entropy
		"virtio_net",     // network (stream netdev)
		"overlay",        // writable layer over a read-only root
		"virtiofs",       // host directory sharing on cold-booted VMs
	}
	genericExtraModules = []string{"9pnet", "9pnet_virtio", "9p"}
)

// Modules returns the modules the initramfs carries for a kernel flavor,
// before dependency resolution. The result is a fresh slice.
func Modules(flavor string) []string {
	m := append([]string(nil), cloudModules...)
	if flavor == FlavorGeneric {
		m = append(m, genericExtraModules...)
	}
	return m
}

// moduleSuffixes are the module file extensions found in Debian kernels.
var moduleSuffixes = []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"}

// moduleName normalises a module file name or module name: the extension
// is dropped and '-' becomes '_', as the kernel does ("virtio-rng.ko" is
// module virtio_rng).
func moduleName(file string) string {
	base := path.Base(file)
	for _, s := range moduleSuffixes {
		if strings.HasSuffix(base, s) {
			base = strings.TrimSuffix(base, s)
			break
		}
	}
	return strings.ReplaceAll(base, "-", "_")
}

// moduleTree indexes a lib/modules/<release> directory.
type moduleTree struct {
	dir     string
	files   map[string]string // module name -> path relative to dir
	builtin map[string]bool   // module names built into the kernel
}

// loadModuleTree walks dir/kernel for module files and reads
// dir/modules.builtin.
func loadModuleTree(dir string) (*moduleTree, error) {
	t := &moduleTree{dir: dir, files: map[string]string{}, builtin: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		for _, s := range moduleSuffixes {
			if strings.HasSuffix(d.Name(), s) {
				rel, err := filepath.Rel(dir, p)
				if err != nil {
					return err
				}
				t.files[moduleName(d.Name())] = rel
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "modules.builtin"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read modules.builtin: %w", err)
	}
	t.builtin = parseBuiltin(b)
	return t, nil
}

// parseBuiltin parses modules.builtin: one "kernel/.../name.ko" per line.
func parseBuiltin(b []byte) map[string]bool {
	m := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			m[moduleName(line)] = true
		}
	}
	return m
}

// read returns the uncompressed ELF bytes of module name.
func (t *moduleTree) read(ctx context.Context, name string) ([]byte, error) {
	rel, ok := t.files[name]
	if !ok {
		return nil, fmt.Errorf("module %s: not found in %s", name, t.dir)
	}
	raw, err := os.ReadFile(filepath.Join(t.dir, rel))
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", name, err)
	}
	var out []byte
	switch {
	case strings.HasSuffix(rel, ".ko"):
		out = raw
	case strings.HasSuffix(rel, ".ko.gz"):
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err == nil {
			out, err = io.ReadAll(io.LimitReader(zr, 256<<20))
		}
		if err != nil {
			return nil, fmt.Errorf("module %s: gunzip: %w", name, err)
		}
	default:
		tool := "xz"
		if strings.HasSuffix(rel, ".ko.zst") {
			tool = "zstd"
		}
		var buf bytes.Buffer
		if err := decodeTool(ctx, &buf, raw, tool, "-dc"); err != nil {
			return nil, fmt.Errorf("module %s: %w", name, err)
		}
		out = buf.Bytes()
	}
	return out, nil
}

// modinfo is the part of a module's .modinfo section that airlock reads.
type modinfo struct {
	name     string
	depends  []string
	vermagic string
}

// parseModinfo reads the .modinfo section (NUL-separated key=value
// strings) of a module's ELF image.
func parseModinfo(ko []byte) (modinfo, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return modinfo{}, fmt.Errorf("parse ELF: %w", err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return modinfo{}, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return modinfo{}, fmt.Errorf("read .modinfo: %w", err)
	}
	var mi modinfo
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			mi.name = v
		case "vermagic":
			mi.vermagic = v
		case "depends":
			for d := range strings.SplitSeq(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.depends = append(mi.depends, moduleName(d))
				}
			}
		}
	}
	return mi, nil
}

// orderModules returns roots and their dependencies in load order
// (dependencies first), skipping built-in modules. deps returns a module's
// direct dependencies. The order is deterministic: roots in the given
// order, each preceded by its not yet listed dependencies in the order
// deps lists them. A dependency cycle is an error.
func orderModules(roots []string, builtin func(string) bool, deps func(string) ([]string, error)) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("module dependency cycle: %s -> %s", strings.Join(chain, " -> "), name)
		}
		if builtin(name) {
			state[name] = done
			return nil
		}
		state[name] = visiting
		ds, err := deps(name)
		if err != nil {
			return err
		}
		for _, d := range ds {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, r := range roots {
		if err := visit(moduleName(r), nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// module is one module packed into the initramfs.
type module struct {
	name string
	data []byte // uncompressed ELF
}

// resolveModules returns the modules for roots plus their dependencies, in
// load order, read from the tree at dir. Each module's vermagic must name
// release.
func resolveModules(ctx context.Context, dir, release string, roots []string) ([]module, error) {
	t, err := loadModuleTree(dir)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{}
	deps := func(name string) ([]string, error) {
		ko, err := t.read(ctx, name)
		if err != nil {
			return nil, err
		}
		mi, err := parseModinfo(ko)
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", name, err)
		}
		if vm, _, _ := strings.Cut(mi.vermagic, " "); release != "" && vm != release {
			return nil, fmt.Errorf("module %s: vermagic %q does not match kernel %s", name, mi.vermagic, release)
		}
		data[name] = ko
		return mi.depends, nil
	}
	order, err := orderModules(roots, func(n string) bool { return t.builtin[n] }, deps)
	if err != nil {
		return nil, err
	}
	mods := make([]module, 0, len(order))
	for _, n := range order {
		mods = append(mods, module{name: n, data: data[n]})
	}
	return mods, nil
}
