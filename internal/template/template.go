package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// templateFormat changes whenever the template layout or the VM's device set
// changes, so old templates are never restored into a new device layout.
//
//	v2: x86-64-v2 guest CPU under TCG
//	v3: a virtio-net NIC (runtime.Spec.Network), down in the template
//	v5: no SVM/VMX in the guest CPU (no nested virtualization)
//	v6: tsc=reliable under TCG (a tickless guest kernel)
//	v7: a warm Python kernel in the guest (agent protocol 10)
const templateFormat = "v7"

// Key is everything a restored clone must share with its template.
type Key struct {
	Format      string `json:"format"`
	ImageDigest string `json:"image_digest"`
	ImagePath   string `json:"image_path"`
	Kernel      string `json:"kernel"`
	Initrd      string `json:"initrd"`
	CPUs        int    `json:"cpus"`
	DiskMiB     int    `json:"disk_mib"`
	MemoryMiB   int    `json:"memory_mib"`
	Runtime     string `json:"runtime"`
	Accel       string `json:"accel"`
	VMM         string `json:"vmm"`
}

// DiskMiB is the root disk size templates of an image are built
// with, and so the default --disk: clones of that size need no resize.
func DiskMiB(imageSize int64) int {
	imgMiB := int((imageSize + (1<<20 - 1)) >> 20)
	return max(2048, imgMiB+512)
}

// ID is the key's content hash (first 16 bytes, hex).
func (k Key) ID() string {
	k.Format = templateFormat
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// Template is a booted, snapshotted guest that sandboxes are cloned from.
type Template struct {
	Dir      string
	Disk     string // frozen qcow2 the clones' overlays are backed by
	Snapshot string // directory for runtime.Spec.RestoreFrom
	Key      Key
	Built    bool          // true if this call built it
	BuildDur time.Duration // how long the build took, if Built
}

type templateMeta struct {
	Key       Key       `json:"key"`
	CreatedAt time.Time `json:"created_at"`
}

// Ensure returns the template for key, building it first if needed
// (a cold boot plus a snapshot, a few seconds under TCG). Concurrent callers
// in any process build it once: a flock on the template's lock file
// serialises builders, and meta.json, written last, marks it complete.
func Ensure(ctx context.Context, l statedir.Layout, rt runtime.Runtime, key Key, log *slog.Logger) (Template, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key.Format = templateFormat
	t := newTemplate(l, key.ID(), key)
	return ensureBuilt(ctx, l, t, func() error { return buildTemplate(ctx, t, rt, log) }, log)
}

func newTemplate(l statedir.Layout, id string, key Key) Template {
	return Template{
		Dir:      filepath.Join(l.Templates(), id),
		Key:      key,
		Disk:     filepath.Join(l.Templates(), id, "disk.qcow2"),
		Snapshot: filepath.Join(l.Templates(), id, "snap"),
	}
}

// ensureBuilt returns t once it is complete, running build (which fills
// t.Dir) under the template's lock if no process has built it yet.
func ensureBuilt(ctx context.Context, l statedir.Layout, t Template, build func() error, log *slog.Logger) (Template, error) {
	id, key := filepath.Base(t.Dir), t.Key
	meta := filepath.Join(t.Dir, "meta.json")
	if _, err := os.Stat(meta); err == nil {
		return t, nil
	}
	// Traversable, not listable: sandbox memory lives in snapshot
	// templates, and disks are found only by knowing their ids.
	_ = os.MkdirAll(l.Templates(), 0o711)
	if err := os.Chmod(l.Templates(), 0o711); err != nil {
		return t, fmt.Errorf("template dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(l.Templates(), id+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return t, fmt.Errorf("template lock: %w", err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return t, fmt.Errorf("template lock: %w", err)
	}
	defer func() { _ = unix.Flock(int(lf.Fd()), unix.LOCK_UN) }() // closing lf releases it too
	if _, err := os.Stat(meta); err == nil {
		return t, nil // another process built it while we waited
	}
	start := time.Now()
	log.Info("building template", "template", id, "memory_mib", key.MemoryMiB, "cpus", key.CPUs)
	if err := build(); err != nil {
		_ = os.RemoveAll(t.Dir)
		return t, fmt.Errorf("build template: %w", err)
	}
	if err := MarkBuilt(t.Dir, key); err != nil {
		_ = os.RemoveAll(t.Dir)
		return t, err
	}
	t.Built, t.BuildDur = true, time.Since(start)
	log.Info("template ready", "template", id, "took", t.BuildDur.Round(time.Millisecond))
	return t, nil
}

// MarkBuilt writes the meta.json of the template in dir, built for key (of
// the current template format), which marks it complete.
func MarkBuilt(dir string, key Key) error {
	key.Format = templateFormat
	b, _ := json.MarshalIndent(templateMeta{Key: key, CreatedAt: time.Now().UTC()}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), b, 0o444); err != nil {
		return fmt.Errorf("write template meta: %w", err)
	}
	return nil
}

func buildTemplate(ctx context.Context, t Template, rt runtime.Runtime, log *slog.Logger) error {
	_ = os.RemoveAll(t.Dir) // a build that died half way
	if err := os.MkdirAll(t.Dir, 0o755); err != nil {
		return err
	}
	if err := statedir.CreateOverlay(ctx, t.Disk, t.Key.ImagePath, "raw", t.Key.DiskMiB); err != nil {
		return err
	}
	spec := runtime.Spec{
		ID:             "tmpl-" + t.Key.ID()[:8],
		CPUs:           t.Key.CPUs,
		MemoryMiB:      t.Key.MemoryMiB,
		Kernel:         t.Key.Kernel,
		Initrd:         t.Key.Initrd,
		RootDisk:       t.Disk,
		RootDiskFormat: "qcow2",
		Snapshottable:  true,
		// Clones restore into the template's device set: every sandbox
		// gets a NIC, brought up by its own Sync after the restore.
		Network: true,
	}
	if err := snapshotInstance(ctx, rt, spec, t, func(inst runtime.Instance, conn net.Conn) error {
		return warmTemplate(ctx, t, inst, conn, log)
	}); err != nil {
		return err
	}
	// Frozen from now on: clones' overlays are backed by it.
	return os.Chmod(t.Disk, 0o444)
}

// snapshotInstance runs spec (RunDir is set here) until work, given the
// agent channel's host end (work must close it; nil with
// Spec.NoAgentHost), is done, then saves it
// into t.Snapshot and ends it. Nobody serves the guest's link: it is
// drained so that the guest never stalls on a full socket.
func snapshotInstance(ctx context.Context, rt runtime.Runtime, spec runtime.Spec, t Template, work func(runtime.Instance, net.Conn) error) error {
	spec.RunDir = filepath.Join(t.Dir, "run")
	if err := os.MkdirAll(spec.RunDir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(spec.RunDir)
	inst, err := rt.Create(ctx, spec)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			_ = inst.Kill()
			_, _ = inst.Wait(context.WithoutCancel(ctx))
		}
	}()
	if err := inst.Start(ctx); err != nil {
		return err
	}
	if nw, isNet := inst.(runtime.Networker); isNet {
		nc, err := nw.NetConn(ctx)
		if err != nil {
			return err
		}
		var drain sync.WaitGroup
		drain.Go(func() { _, _ = io.Copy(io.Discard, nc) })
		defer func() {
			nc.Close()
			drain.Wait()
		}()
	}
	var conn net.Conn
	if !spec.NoAgentHost {
		if conn, err = inst.AgentConn(ctx); err != nil {
			return err
		}
	}
	if err := work(inst, conn); err != nil {
		return err
	}
	snap, isSnap := inst.(runtime.Snapshotter)
	if !isSnap {
		return errors.New("runtime cannot snapshot")
	}
	if err := os.MkdirAll(t.Snapshot, 0o755); err != nil {
		return err
	}
	if err := snap.SaveSnapshot(ctx, t.Snapshot); err != nil {
		return err
	}
	ok = true
	_ = inst.Kill()
	_, err = inst.Wait(context.WithoutCancel(ctx))
	return err
}

// warmTemplate syncs a freshly booted template guest and warms it up.
func warmTemplate(ctx context.Context, t Template, inst runtime.Instance, conn net.Conn, log *slog.Logger) error {
	bootCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := DialAgent(bootCtx, inst, conn)
	if err != nil {
		return err
	}
	// Grow the filesystem once here, so clones of the default size start
	// with it grown.
	// The NIC is configured as every sandbox has it (its own link and
	// stack make the same address safe for all): a clone's Sync then finds
	// nothing to change unless it has no network or a CA to install.
	if _, err := c.SyncWith(bootCtx, agentapi.SyncOptions{
		Hostname:  "airlock",
		DiskBytes: uint64(t.Key.DiskMiB) << 20,
		Network:   GuestNetwork(true, nil),
	}); err != nil {
		c.Close()
		return err
	}
	// Warm the guest page cache and TCG with what most sandboxes run first;
	// the template's RAM (page cache included) is shared by every clone.
	for _, argv := range [][]string{{"true"}, {"sh", "-c", "command -v python3 >/dev/null && python3 -c 'import sys' || true"}} {
		if err := warmExec(bootCtx, c, argv); err != nil {
			log.Warn("template warm-up", "argv", argv, "err", err)
		}
	}
	// A warm Python kernel: a clone's first Python code then answers at
	// once instead of after the kernel's start (seconds, 12 s under TCG).
	// The agent keeps it apart until a sandbox's default Python context
	// asks for it, and seeds its random state again then.
	if c.Require(agentapi.VersionWarm, "warm context") == nil {
		t0 := time.Now()
		if _, err := c.Contexts.Create(bootCtx, connect.NewRequest(&agentv1.CreateContextRequest{Language: "python", Warm: true})); err != nil {
			log.Info("template warm-up: no warm python context", "err", err) // an image without python3 and ipykernel
		} else {
			log.Info("template warm-up: python context started", "took", time.Since(t0).Round(time.Millisecond))
		}
	}
	// Close the agent session; SaveSnapshot waits for the guest to see the
	// disconnect, so clones start with the agent waiting for a new host.
	c.Close()
	return nil
}

// warmExec runs argv in a template guest straight through the agent (no
// shim runs yet) and waits for its exit, discarding its output.
func warmExec(ctx context.Context, c *agentapi.Client, argv []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := c.Exec.Exec(ctx)
	defer func() { _ = st.CloseResponse() }()
	if err := st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{Argv: argv, TimeoutMs: 60000}}}); err != nil {
		return err
	}
	for {
		ev, err := st.Receive()
		if err != nil {
			return err
		}
		if ev.GetExited() != nil {
			return nil
		}
	}
}

// DialAgent waits for the agent on conn, failing early with the VMM's exit
// reason if the guest dies while booting. On failure conn is closed.
func DialAgent(ctx context.Context, inst runtime.Instance, conn net.Conn) (*agentapi.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := make(chan runtime.ExitStatus, 1)
	go func() {
		if st, err := inst.Wait(ctx); err == nil {
			exited <- st
		}
	}()
	type result struct {
		c   *agentapi.Client
		err error
	}
	res := make(chan result, 1)
	go func() {
		// Messages up to guest.MaxCodeMessageBytes: a code result carries an
		// image of up to guest.MaxResultValueBytes in one message.
		c, err := agentapi.Dial(ctx, conn, agentapi.Options{MaxMessageBytes: guest.MaxCodeMessageBytes})
		res <- result{c, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			conn.Close()
		}
		return r.c, r.err
	case st := <-exited:
		cancel()
		if r := <-res; r.c != nil {
			r.c.Close()
		}
		conn.Close()
		return nil, fmt.Errorf("guest stopped while booting: %s", st.String())
	}
}

// GuestNetwork is the agent's network config for a sandbox: every guest has
// the address netconf.GuestIP behind the gateway netconf.GatewayIP, which
// also answers DNS; ca is the interception CA to trust (nil: none).
// Disabled means no network at all: the NIC goes down.
func GuestNetwork(enabled bool, ca []byte) *agentv1.NetworkConfig {
	if !enabled {
		return &agentv1.NetworkConfig{Enabled: false}
	}
	return &agentv1.NetworkConfig{
		Enabled:     true,
		Address:     netip.PrefixFrom(netconf.GuestIP, netconf.PrefixLen).String(),
		Gateway:     netconf.GatewayIP.String(),
		Nameservers: []string{netconf.GatewayIP.String()},
		CaCertPem:   ca,
	}
}

// RemoveForImage deletes every template booted from the image digest.
func RemoveForImage(l statedir.Layout, imageDigest string) error {
	metas, _ := filepath.Glob(filepath.Join(l.Templates(), "*", "meta.json"))
	var errs []error
	for _, mp := range metas {
		b, err := os.ReadFile(mp)
		if err != nil {
			continue
		}
		var m templateMeta
		if json.Unmarshal(b, &m) == nil && m.Key.ImageDigest == imageDigest {
			errs = append(errs, os.RemoveAll(filepath.Dir(mp)))
		}
	}
	return errors.Join(errs...)
}

// TakeOverlay puts a qcow2 overlay of the template's disk (same size) at
// path. It claims a spare made earlier by rename (no process to spawn) and
// falls back to creating one.
func (t Template) TakeOverlay(ctx context.Context, path string) error {
	spares, _ := filepath.Glob(filepath.Join(t.Dir, "spare-*.qcow2"))
	for _, sp := range spares {
		if err := os.Rename(sp, path); err == nil {
			return nil
		}
	}
	return statedir.CreateOverlay(ctx, path, t.Disk, "qcow2", 0)
}

// MakeSpare creates one spare overlay for the next TakeOverlay, unless
// enough exist. Best effort: errors only cost the next create ~15 ms.
func (t Template) MakeSpare(ctx context.Context) {
	spares, _ := filepath.Glob(filepath.Join(t.Dir, "spare-*.qcow2"))
	if len(spares) >= 2 {
		return
	}
	tmp := filepath.Join(t.Dir, ".tmp-spare-"+statedir.NewID())
	if err := statedir.CreateOverlay(ctx, tmp, t.Disk, "qcow2", 0); err != nil {
		_ = os.Remove(tmp)
		return
	}
	_ = os.Rename(tmp, filepath.Join(t.Dir, "spare-"+statedir.NewID()+".qcow2"))
}
