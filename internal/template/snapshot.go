package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// SnapshotID is the id of the template a snapshot's sandboxes are cloned
// from: like an image's template, but booted from the snapshot's state.
func SnapshotID(sid string) string {
	h := sha256.Sum256([]byte("snapshot-template:" + sid))
	return hex.EncodeToString(h[:16])
}

// EnsureSnapshot returns the template of snapshot sid, building it
// once (concurrent callers in any process share one build): the snapshot's
// full state is restored into a RAM file and saved as a template, whose
// RAM its clones map copy-on-write and share (a fork template). The
// snapshot's digests are checked before the build. cpus and memMiB are the
// snapshot's.
func EnsureSnapshot(ctx context.Context, l statedir.Layout, rt runtime.Runtime, sid string, key Key, log *slog.Logger) (Template, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sdir := l.SnapshotDir(sid)
	var man statedir.PauseManifest
	b, err := os.ReadFile(filepath.Join(sdir, statedir.PauseManifestFile))
	if err != nil || json.Unmarshal(b, &man) != nil {
		return Template{}, fmt.Errorf("snapshot %s has no readable manifest", sid)
	}
	key.Kernel, key.Initrd, key.Format = man.Kernel, man.Initrd, templateFormat
	t := newTemplate(l, SnapshotID(sid), key)
	return ensureBuilt(ctx, l, t, func() error { return buildSnapshotTemplate(ctx, t, rt, sdir, man, log) }, log)
}

func buildSnapshotTemplate(ctx context.Context, t Template, rt runtime.Runtime, sdir string, man statedir.PauseManifest, log *slog.Logger) error {
	_ = os.RemoveAll(t.Dir)
	if err := os.MkdirAll(t.Dir, 0o755); err != nil {
		return err
	}
	state := filepath.Join(sdir, statedir.PauseStateDir)
	disk := filepath.Join(sdir, statedir.SnapshotDisk)
	// The digests are checked while the state loads (as a resume does):
	// the template is saved only if they match.
	verified := make(chan error, 1)
	go func() {
		if sum, size, err := statedir.HashDir(state); err != nil || sum != man.StateSHA256 || size != man.StateBytes {
			verified <- fmt.Errorf("snapshot state is corrupt (its digest does not match the manifest): %v", err)
			return
		}
		h := sha256.New()
		if _, err := statedir.HashFile(h, disk, statedir.SnapshotDisk); err != nil || hex.EncodeToString(h.Sum(nil)) != man.DiskSHA256 {
			verified <- fmt.Errorf("snapshot disk is corrupt (its digest does not match the manifest): %v", err)
			return
		}
		verified <- nil
	}()
	if err := statedir.CreateOverlay(ctx, t.Disk, disk, "qcow2", 0); err != nil {
		return errors.Join(err, <-verified)
	}
	spec := runtime.Spec{
		ID:             "snap-" + filepath.Base(t.Dir)[:8],
		CPUs:           t.Key.CPUs,
		MemoryMiB:      t.Key.MemoryMiB,
		Kernel:         man.Kernel,
		Initrd:         man.Initrd,
		RootDisk:       t.Disk,
		RootDiskFormat: "qcow2",
		RestoreFrom:    state,
		Snapshottable:  true,
		Network:        true,
		// The saved guest's agent waits for a host (the pause or live
		// snapshot let it see the last one go); with none connecting, it
		// still waits in the template, as every clone's must.
		NoAgentHost: true,
	}
	waited := false
	err := snapshotInstance(ctx, rt, spec, t, func(runtime.Instance, net.Conn) error {
		waited = true
		return <-verified
	})
	if !waited {
		// No goroutine outlives the build; a corrupt snapshot explains a
		// failed restore.
		err = errors.Join(err, <-verified)
	}
	if err != nil {
		return err
	}
	log.Info("snapshot template saved", "template", filepath.Base(t.Dir))
	// The snapshot's memory is the user's: root only (the runtime hands it
	// to VMMs as a memfd). The disk is opened by path by VMM uids: the dir
	// is traversable, not listable.
	return errors.Join(os.Chmod(t.Snapshot, 0o700), os.Chmod(t.Dir, 0o711), os.Chmod(t.Disk, 0o444))
}

// RemoveSnapshot deletes the template built from snapshot sid.
func RemoveSnapshot(l statedir.Layout, sid string) error {
	dir := filepath.Join(l.Templates(), SnapshotID(sid))
	_ = os.Remove(dir + ".lock")
	return os.RemoveAll(dir)
}

// OriginSnapshot returns the id of the snapshot sandbox id starts from
// (its shim then clones the snapshot's template), or "".
func OriginSnapshot(ctx context.Context, st *store.Store, id string) (string, error) {
	objs, err := st.Targets(ctx, store.SandboxObj(id), store.RoleOrigin)
	if err != nil || len(objs) == 0 {
		return "", err
	}
	return objs[0].ID, nil
}
