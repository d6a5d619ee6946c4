package bootfiles

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cavaliergopher/cpio"
)

// initramfsFormat names the archive layout. Change it whenever
// writeInitramfs changes, so that cached archives are rebuilt.
const initramfsFormat = "airlock-initramfs-v1"

// Paths inside the initramfs, for the agent.
const (
	// InitPath is where the agent binary lives; the kernel runs it as PID 1.
	InitPath = "/init"
	// ModulesPath is the directory holding the kernel modules, as
	// <name>.ko files (uncompressed).
	ModulesPath = "/mods"
	// ModuleOrderPath lists the module file names in ModulesPath, one per
	// line, in the order they must be loaded.
	ModuleOrderPath = "/mods/order"
	// NewRootPath is an empty directory for the agent to mount the root
	// disk on before switching to it.
	NewRootPath = "/newroot"
)

// maxAgentSize caps the agent binary read into memory.
const maxAgentSize = 256 << 20

// BuildInitramfs returns the path of an uncompressed newc cpio archive for
// kernel k that holds:
//
//   - /init: agentBinary (mode 0755), a static binary the kernel runs as PID 1;
//   - /mods/<name>.ko: the modules of Modules(k.Flavor) and their
//     dependencies (read from each module's .modinfo), decompressed, minus
//     those built into the kernel;
//   - /mods/order: their file names, one per line, dependencies first;
//   - the directories /dev /proc /sys /tmp /newroot and the node
//     /dev/console, so PID 1 has a console before it mounts devtmpfs.
//
// The archive is cached at stateDir/initramfs/<sha256 of the inputs>.cpio
// (mode 0444) and rebuilt only when the agent, a module or the module list
// changes. Concurrent calls are safe: each writes a temp file and renames
// it into place.
func BuildInitramfs(ctx context.Context, stateDir string, k Kernel, agentBinary string) (string, error) {
	agent, err := readAgent(agentBinary)
	if err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	mods, err := resolveModules(ctx, k.ModulesDir, k.Release, Modules(k.Flavor))
	if err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}

	key := initramfsKey(agent, mods)
	dir := filepath.Join(stateDir, "initramfs")
	dst := filepath.Join(dir, key+".cpio")
	if _, err := os.Stat(dst); err == nil {
		return filepath.Abs(dst)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	if err := writeInitramfsFile(dst, agent, mods); err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	return filepath.Abs(dst)
}

func readAgent(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAgentSize+1))
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	if len(b) > maxAgentSize {
		return nil, fmt.Errorf("agent %s is larger than %d bytes", p, maxAgentSize)
	}
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("agent %s is not an ELF binary: %w", p, err)
	}
	defer ef.Close()
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("agent %s is dynamically linked; build it with CGO_ENABLED=0", p)
		}
	}
	return b, nil
}

// initramfsKey hashes everything that goes into the archive.
func initramfsKey(agent []byte, mods []module) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nagent %d\n", initramfsFormat, len(agent))
	h.Write(agent)
	for _, m := range mods {
		fmt.Fprintf(h, "\nmodule %s %d\n", m.name, len(m.data))
		h.Write(m.data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeInitramfsFile(dst string, agent []byte, mods []module) (err error) {
	f, err := os.CreateTemp(filepath.Dir(dst), tmpDirPrefix+"*.cpio")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := writeInitramfs(bw, agent, mods); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Chmod(0o444); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// writeInitramfs writes the archive described at BuildInitramfs. Entries
// are in a fixed order with zero timestamps and owner 0:0, so equal inputs
// give equal bytes.
func writeInitramfs(w io.Writer, agent []byte, mods []module) error {
	// cpio.Writer cannot record a device number, so the first two entries
	// (/dev and /dev/console) are encoded here; the rest of the archive
	// follows in the same stream.
	if err := writeNewcEntry(w, "dev", cpio.TypeDir|0o755, 2, 0, 0, 1); err != nil {
		return err
	}
	if err := writeNewcEntry(w, "dev/console", cpio.TypeChar|0o600, 1, 5, 1, 2); err != nil {
		return err
	}
	cw := cpio.NewWriter(w)
	dir := func(name string, perm cpio.FileMode) error {
		return cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeDir | perm, Links: 2, Inode: 0})
	}
	file := func(name string, perm cpio.FileMode, data []byte) error {
		if err := cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | perm, Links: 1, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := cw.Write(data)
		return err
	}
	for _, d := range []struct {
		name string
		perm cpio.FileMode
	}{{"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777}, {"newroot", 0o755}, {"mods", 0o755}} {
		if err := dir(d.name, d.perm); err != nil {
			return err
		}
	}
	if err := file(strings.TrimPrefix(InitPath, "/"), 0o755, agent); err != nil {
		return err
	}
	var order strings.Builder
	for _, m := range mods {
		if m.name == "" || strings.ContainsAny(m.name, "/\n\x00") {
			return fmt.Errorf("bad module name %q", m.name)
		}
		name := m.name + ".ko"
		if err := file(strings.TrimPrefix(ModulesPath, "/")+"/"+name, 0o644, m.data); err != nil {
			return err
		}
		order.WriteString(name + "\n")
	}
	if err := file(strings.TrimPrefix(ModuleOrderPath, "/"), 0o644, []byte(order.String())); err != nil {
		return err
	}
	return cw.Close()
}

// newcInodeBase keeps the hand-written entries' inode numbers apart from
// the ones cpio.Writer assigns (1, 2, ...).
const newcInodeBase = 0x7fff0000

// writeNewcEntry writes one header-only newc ("070701") entry: a directory
// or a device node. rdevMajor and rdevMinor are the device number.
func writeNewcEntry(w io.Writer, name string, mode cpio.FileMode, links, rdevMajor, rdevMinor, ino int) error {
	if mode&cpio.ModeType == cpio.TypeReg || mode&cpio.ModeType == cpio.TypeSymlink {
		return errors.New("writeNewcEntry: only header-only entries")
	}
	var b bytes.Buffer
	fields := []int64{
		int64(newcInodeBase + ino), int64(mode), 0, 0, int64(links), 0, 0, // ino mode uid gid nlink mtime filesize
		0, 0, int64(rdevMajor), int64(rdevMinor), // devmajor devminor rdevmajor rdevminor
		int64(len(name) + 1), 0, // namesize check
	}
	b.WriteString("070701")
	for _, f := range fields {
		fmt.Fprintf(&b, "%08x", f)
	}
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	_, err := w.Write(b.Bytes())
	return err
}
