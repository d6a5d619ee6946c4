package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu/qmp"
)

// Snapshot directory layout (notes §5 (b)). A template (SaveSnapshot, kind
// "template") has all three files; a full-state snapshot (SaveState, kind
// "full") has state.bin, holding every RAM page too, and meta.json.
const (
	snapState = "state.bin" // QEMU migration stream
	snapMem   = "mem.raw"   // guest RAM of a template, sparse
	snapMeta  = "meta.json" // what a restore must match
)

// Snapshot kinds (snapshotMeta.Kind).
const (
	kindTemplate = "template" // device state only; RAM in mem.raw (also "" in older metas)
	kindFull     = "full"     // RAM and device state in state.bin
)

// snapshotMeta is what a restored instance must match: the device set and
// RAM layout come from the same Spec fields and accelerator.
type snapshotMeta struct {
	Version   int    `json:"version"`
	Kind      string `json:"kind,omitempty"` // kindTemplate or kindFull
	Accel     string `json:"accel"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memory_mib"`
	Kernel    string `json:"kernel"`
	Initrd    string `json:"initrd"`
	DiskFmt   string `json:"root_disk_format"`
	Network   bool   `json:"network,omitempty"` // a virtio-net NIC (fdNet)
	TSCkHz    int64  `json:"tsc_khz,omitempty"`
	// Machine is the machine profile the guest runs on (machineV2; ""
	// before it existed). Its restore gets the same device set and CPU.
	Machine string `json:"machine,omitempty"`
	QEMU    string `json:"qemu"`
	SavedAt string `json:"saved_at"`
}

// snapshotSettle is how long SaveSnapshot lets the guest settle after the
// caller closed the agent channel.
var snapshotSettle = 300 * time.Millisecond

const (
	ignoreShared   = `{"capabilities":[{"capability":"x-ignore-shared","state":true}]}`
	noIgnoreShared = `{"capabilities":[{"capability":"x-ignore-shared","state":false}]}`
)

// SaveSnapshot migrates the running guest's device state into dir/state.bin
// (its RAM already lives in a file with share=on, so nothing of it is
// copied), stops QEMU, and moves the RAM file to dir/mem.raw. Both files
// end root-owned and 0444. dir must exist and be empty. If it fails before
// the migration starts the instance keeps running; from then on it ends
// (Wait reports Requested) whether or not the snapshot succeeds.
func (in *instance) SaveSnapshot(ctx context.Context, dir string) (err error) {
	if !in.spec.Snapshottable {
		return fmt.Errorf("%w: instance was not created Snapshottable", errdefs.ErrFailedPrecondition)
	}
	in.mu.Lock()
	q, state := in.qmp, in.state
	in.mu.Unlock()
	if state != stateRunning || q == nil {
		return fmt.Errorf("snapshot: %w", runtime.ErrNotRunning)
	}
	if ents, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("snapshot dir: %w", err)
	} else if len(ents) > 0 {
		return fmt.Errorf("%w: snapshot dir is not empty", errdefs.ErrInvalid)
	}
	defer func() {
		if err != nil {
			// A half-written snapshot must not be used.
			for _, n := range []string{snapState, snapMem, snapMeta} {
				_ = os.Remove(filepath.Join(dir, n))
			}
		}
	}()
	// The caller has just closed the agent channel. Give the guest time to
	// see the disconnect (its agent ends the session and blocks writing
	// the next banner) before freezing it: a clone that inherits a session
	// that never saw its EOF gets no banner (internal/agent/vport, "known
	// limit").
	if in.spec.NoAgentHost {
		// No host ever connected: the agent waits as it was saved.
	} else if err := clock.Sleep(ctx, snapshotSettle); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	t0 := time.Now()
	if err := q.Execute(ctx, "migrate-set-capabilities", json.RawMessage(ignoreShared), nil); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, snapState), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot state: %w", err)
	}
	defer f.Close()
	if err := q.SendFD(ctx, "snap", f); err != nil {
		return err
	}
	// Migrate while running: the stream records runstate=running, so
	// clones resume by themselves (no `cont` round trip).
	if err := q.Execute(ctx, "migrate", map[string]string{"uri": "fd:snap"}, nil); err != nil {
		return err
	}
	if err := waitMigration(ctx, q, "completed"); err != nil {
		in.kill(true)
		<-in.done
		return err
	}
	migrated := time.Since(t0)
	if err := f.Sync(); err != nil {
		return fmt.Errorf("snapshot state: %w", err)
	}

	// The guest sits stopped in postmigrate: its RAM is the snapshot's.
	// Copy it out before QEMU goes (its memfd goes with it).
	in.mu.Lock()
	ram := in.ram
	in.mu.Unlock()
	tCopy := time.Now()
	copyErr := copyNonZero(filepath.Join(dir, snapMem), ram)
	copied := time.Since(tCopy)
	// End the source. quit flushes the disk.
	tQuit := time.Now()
	in.quitMigrated(ctx, q)
	quit := time.Since(tQuit)
	if copyErr != nil {
		return fmt.Errorf("snapshot ram: %w", copyErr)
	}
	if err := in.writeMeta(dir, kindTemplate, diskFormat(in.spec), q.Version().String(), snapState, snapMem); err != nil {
		return err
	}
	in.log.Info("snapshot saved", "migrate", migrated, "copy_ram", copied, "quit", quit, "total", time.Since(t0))
	return nil
}

// writeMeta writes dir/meta.json for a snapshot of kind, then makes it and
// files (in dir) root-owned and 0444 and syncs dir.
func (in *instance) writeMeta(dir, kind, diskFmt, qemuVersion string, files ...string) error {
	meta := snapshotMeta{
		Version: 1, Kind: kind, Accel: in.accel, CPUs: in.spec.CPUs, MemoryMiB: in.spec.MemoryMiB,
		Kernel: in.spec.Kernel, Initrd: in.spec.Initrd, DiskFmt: diskFmt, Network: in.spec.Network,
		Machine: in.machine, QEMU: qemuVersion, SavedAt: time.Now().UTC().Format(time.RFC3339),
	}
	if in.accel != "kvm" {
		meta.TSCkHz = in.rt.tscKHz
	}
	b, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, snapMeta), b, 0o444); err != nil {
		return fmt.Errorf("snapshot meta: %w", err)
	}
	for _, n := range append(files, snapMeta) {
		p := filepath.Join(dir, n)
		if err := errors.Join(os.Chown(p, 0, 0), os.Chmod(p, 0o444)); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// quitMigrated ends a VMM whose state was migrated out (it sits in
// postmigrate; quit flushes the disk), killing it if it does not go.
func (in *instance) quitMigrated(ctx context.Context, q *qmp.Client) {
	in.mu.Lock()
	in.requested = true
	in.mu.Unlock()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	qerr := q.Execute(qctx, "quit", nil, nil)
	cancel()
	if qerr != nil || !in.waitDone(5*time.Second) {
		in.kill(true)
		<-in.done
	}
}

// incoming loads a snapshot into a QEMU started with -incoming defer and
// waits until the guest runs. A template's stream leaves its RAM out
// (x-ignore-shared) and resumes by itself; a full one carries all RAM and
// was saved stopped, so the guest is continued here.
func (in *instance) incoming(ctx context.Context, q *qmp.Client) error {
	caps := json.RawMessage(ignoreShared)
	if in.restoreKind == kindFull {
		caps = json.RawMessage(noIgnoreShared)
	}
	if err := q.Execute(ctx, "migrate-set-capabilities", caps, nil); err != nil {
		return err
	}
	if err := q.Execute(ctx, "migrate-incoming", map[string]string{"uri": fmt.Sprintf("fd:%d", fdIncoming)}, nil); err != nil {
		return err
	}
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "running":
			return nil
		case "paused":
			if in.restoreKind != kindFull {
				return errors.New("restore: guest is paused")
			}
			if err := waitMigration(ctx, q, "completed"); err != nil {
				return fmt.Errorf("restore: %w", err)
			}
			if err := q.Execute(ctx, "cont", nil, nil); err != nil {
				return fmt.Errorf("restore: %w", err)
			}
		case "inmigrate", "prelaunch", "restore-vm":
		default:
			var m struct {
				Status string `json:"status"`
				Error  string `json:"error-desc"`
			}
			_ = q.Execute(ctx, "query-migrate", nil, &m)
			return fmt.Errorf("restore: guest is %s, migration %s %s", st.Status, m.Status, m.Error)
		}
		if err := clock.Sleep(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
}

// waitMigration polls query-migrate until it reports want.
func waitMigration(ctx context.Context, q *qmp.Client, want string) error {
	for {
		var m struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := q.Execute(ctx, "query-migrate", nil, &m); err != nil {
			return err
		}
		switch m.Status {
		case want:
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", m.Status, m.Error)
		}
		if err := clock.Sleep(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("migration: %w", err)
		}
	}
}

// checkSnapshotMeta refuses a restore whose Spec or host does not match the
// snapshot (QEMU would fail later, less clearly, or resume a broken guest).
// It returns the snapshot's meta, with its kind set.
func checkSnapshotMeta(spec runtime.Spec, accel string) (snapshotMeta, error) {
	b, err := os.ReadFile(filepath.Join(spec.RestoreFrom, snapMeta))
	if err != nil {
		return snapshotMeta{}, fmt.Errorf("%w: snapshot: %w", errdefs.ErrNotFound, err)
	}
	var m snapshotMeta
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
		return snapshotMeta{}, fmt.Errorf("%w: snapshot: unreadable meta.json", errdefs.ErrInvalid)
	}
	if m.Kind == "" {
		m.Kind = kindTemplate
	}
	return m, m.check(spec, accel)
}

func (m *snapshotMeta) check(spec runtime.Spec, accel string) error {
	switch {
	case m.Kind != kindTemplate && m.Kind != kindFull:
		return fmt.Errorf("%w: snapshot of unknown kind %q", errdefs.ErrInvalid, m.Kind)
	case m.Kind == kindTemplate && spec.Snapshottable:
		return fmt.Errorf("%w: spec: an instance restored from a template cannot be snapshotted again (its RAM is a private copy)", errdefs.ErrInvalid)
	case m.Accel != accel:
		return fmt.Errorf("%w: snapshot taken under %s, this host uses %s", errdefs.ErrFailedPrecondition, m.Accel, accel)
	case m.CPUs != spec.CPUs || m.MemoryMiB != spec.MemoryMiB:
		return fmt.Errorf("%w: snapshot has %d cpus and %d MiB, spec asks %d and %d", errdefs.ErrInvalid, m.CPUs, m.MemoryMiB, spec.CPUs, spec.MemoryMiB)
	case m.Kernel != spec.Kernel || m.Initrd != spec.Initrd || m.DiskFmt != diskFormat(spec):
		return fmt.Errorf("%w: snapshot was taken with another kernel, initramfs or disk format", errdefs.ErrInvalid)
	case m.Network != spec.Network:
		return fmt.Errorf("%w: snapshot network is %v, spec asks %v", errdefs.ErrInvalid, m.Network, spec.Network)
	case m.Machine != "" && m.Machine != machineV2:
		return fmt.Errorf("%w: snapshot of machine profile %q, this airlock knows %q and the one before it", errdefs.ErrFailedPrecondition, m.Machine, machineV2)
	}
	return nil
}

func diskFormat(spec runtime.Spec) string {
	if spec.RootDiskFormat == "" {
		return "qcow2"
	}
	return spec.RootDiskFormat
}

// copyNonZero writes the non-zero pages of src (a RAM memfd, every page of
// which a restore may have allocated) into a new file at path, at the same
// offsets, and gives it src's size: zero pages stay holes. src is read
// through a read-only mapping, not copied.
func copyNonZero(path string, src *os.File) error {
	if src == nil {
		return errors.New("the instance has no RAM file")
	}
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if size == 0 {
		return dst.Close()
	}
	mem, err := syscall.Mmap(int(src.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		dst.Close()
		return fmt.Errorf("map ram: %w", err)
	}
	defer syscall.Munmap(mem) //nolint:errcheck // unmapping a mapping made here
	const page = 4096
	zero := make([]byte, page)
	isZero := func(off int) bool {
		return bytes.Equal(mem[off:min(off+page, len(mem))], zero[:min(page, len(mem)-off)])
	}
	// Runs of non-zero pages, one write each.
	for i := 0; i < len(mem); {
		if isZero(i) {
			i += page
			continue
		}
		j := i + page
		for j < len(mem) && !isZero(j) {
			j += page
		}
		j = min(j, len(mem))
		if _, err := dst.WriteAt(mem[i:j], int64(i)); err != nil {
			dst.Close()
			return err
		}
		i = j
	}
	return errors.Join(dst.Truncate(size), dst.Close())
}

// memfdCreate is memfd_create(2).
func memfdCreate(name string, flags uintptr) (*os.File, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return nil, err
	}
	fd, _, e := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(p)), flags, 0)
	if e != 0 {
		return nil, fmt.Errorf("memfd_create: %w", e)
	}
	return os.NewFile(fd, "memfd:"+name), nil
}

// copySparse copies src's data regions into dst at the same offsets and
// gives dst src's size; holes stay holes.
func copySparse(dst, src *os.File) error {
	const seekData, seekHole = 3, 4
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	var off int64
	for off < size {
		start, err := src.Seek(off, seekData)
		if err != nil {
			if errors.Is(err, syscall.ENXIO) {
				break // no more data
			}
			return err
		}
		end, err := src.Seek(start, seekHole)
		if err != nil {
			return err
		}
		if _, err := src.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := dst.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(dst, src, end-start); err != nil {
			return err
		}
		off = end
	}
	return dst.Truncate(size)
}

// memCache holds one sealed memfd copy of each snapshot's mem.raw.
//
// QEMU 7.2 opens a memory-backend-file read-write even with share=off, so
// an unprivileged VMM cannot map the root-owned 0444 mem.raw, and making
// it writable would let one clone's QEMU rewrite the RAM of every later
// clone. A memfd is mode 0777 (any uid may open it through
// /proc/self/fd/N) but, sealed against writes, shrinking and growing, no
// one can change it; MAP_PRIVATE mappings stay copy-on-write. Clones of one
// template started by this Runtime share its pages.
type memCache struct {
	mu sync.Mutex
	m  map[string]*memEntry // by path
}

type memEntry struct {
	dev, ino uint64
	size     int64
	mtime    int64
	f        *os.File
}

// get returns a new descriptor of the sealed copy of path; the caller
// closes it.
func (c *memCache) get(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, errors.New("stat " + path)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[path]
	if e == nil || e.dev != st.Dev || e.ino != st.Ino || e.size != fi.Size() || e.mtime != fi.ModTime().UnixNano() {
		if e != nil {
			e.f.Close()
			delete(c.m, path)
		}
		f, err := sealedCopy(src, filepath.Base(filepath.Dir(path)))
		if err != nil {
			return nil, err
		}
		e = &memEntry{dev: st.Dev, ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano(), f: f}
		if c.m == nil {
			c.m = make(map[string]*memEntry)
		}
		c.m[path] = e
	}
	fd, err := syscall.Dup(int(e.f.Fd()))
	if err != nil {
		return nil, err
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), e.f.Name()), nil
}

// put registers f (a sealed memfd copy of path, made elsewhere) for path.
func (c *memCache) put(path string, f *os.File) error {
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("stat " + path)
	}
	mfi, err := f.Stat()
	if err != nil {
		return err
	}
	seals, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), fGetSeals, 0)
	if e != 0 || seals&sealedMemfdSeals != sealedMemfdSeals {
		return fmt.Errorf("%w: snapshot RAM is not a sealed memfd", errdefs.ErrInvalid)
	}
	if mfi.Size() != fi.Size() {
		return fmt.Errorf("%w: snapshot RAM has %d bytes, %s has %d", errdefs.ErrInvalid, mfi.Size(), path, fi.Size())
	}
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return err
	}
	syscall.CloseOnExec(fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[path]; old != nil {
		old.f.Close()
	}
	if c.m == nil {
		c.m = make(map[string]*memEntry)
	}
	c.m[path] = &memEntry{dev: st.Dev, ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano(), f: os.NewFile(uintptr(fd), f.Name())}
	return nil
}

func (c *memCache) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, e := range c.m {
		e.f.Close()
		delete(c.m, p)
	}
}

// SealSnapshotRAM returns a sealed memfd copy of the snapshot RAM in dir
// (dir/mem.raw), the form in which restored instances map it. A long-lived
// process (the daemon) can make it once per snapshot and hand it to every
// process that restores from dir (via ExtraFiles or SCM_RIGHTS), which
// registers it with Runtime.UseSnapshotRAM: clones in all those processes
// then share one copy of the template's RAM instead of one each. The
// caller owns the returned file.
func SealSnapshotRAM(dir string) (*os.File, error) {
	src, err := os.Open(filepath.Join(dir, snapMem))
	if err != nil {
		return nil, err
	}
	defer src.Close()
	return sealedCopy(src, filepath.Base(dir))
}

// UseSnapshotRAM makes restores from dir map f, a copy made by
// SealSnapshotRAM, instead of a copy of this Runtime's own. f must be a
// memfd sealed against writes, shrinking and growing, of mem.raw's size
// (checked); its contents are trusted. The Runtime keeps its own
// descriptor; the caller may close f.
func (r *Runtime) UseSnapshotRAM(dir string, f *os.File) error {
	return r.mems.put(filepath.Join(dir, snapMem), f)
}

// Linux memfd and sealing constants (not all in package syscall).
const (
	mfdCloexec       = 0x1
	mfdAllowSealing  = 0x2
	fAddSeals        = 1033
	fGetSeals        = 1034
	fSealSeal        = 0x1
	fSealShrink      = 0x2
	fSealGrow        = 0x4
	fSealWrite       = 0x8
	sealedMemfdSeals = fSealSeal | fSealShrink | fSealGrow | fSealWrite
)

// sealedCopy copies src into a new memfd and seals it read-only.
func sealedCopy(src *os.File, name string) (*os.File, error) {
	f, err := memfdCreate("airlock-snap-"+name, mfdCloexec|mfdAllowSealing)
	if err != nil {
		return nil, err
	}
	fd := f.Fd()
	if err := copySparse(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copy snapshot ram: %w", err)
	}
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, fAddSeals, sealedMemfdSeals); e != 0 {
		f.Close()
		return nil, fmt.Errorf("seal snapshot ram: %w", e)
	}
	return f, nil
}

// Relocate points the saved state in dir (a pause's, moved from another
// host) at this host's guest kernel and initramfs, which must hold the
// same bytes as those it was saved with (the caller checks their
// digests): a restore matches them by path.
func Relocate(dir, kernel, initrd string) error {
	p := filepath.Join(dir, snapMeta)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var m snapshotMeta
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
		return fmt.Errorf("%w: saved state: unreadable %s", errdefs.ErrInvalid, snapMeta)
	}
	m.Kernel, m.Initrd = kernel, initrd
	if b, err = json.MarshalIndent(m, "", "  "); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o444)
}
