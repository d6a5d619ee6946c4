package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu/qmp"
)

// migrateBandwidth lifts QEMU's default 128 MiB/s migration rate limit:
// the stream goes to a local file and the guest is stopped.
const migrateBandwidth = 1 << 40

// SaveState writes the guest's RAM and device state (a QEMU migration
// stream with every RAM page: x-ignore-shared off; zero pages take a few
// bytes each) to dir/state.bin and dir/meta.json (kind "full"), both
// root-owned and 0444, state.bin fsynced.
//
// The guest is stopped first and migrated stopped, so the stream records
// runstate=paused and a restore continues it itself. With o.KeepRunning,
// o.NewRootDisk is opened here and passed over QMP (add-fd), added as a
// block node without a backing link, and made the root disk's active
// layer with blockdev-snapshot while the guest is stopped, so the previous
// file is never written again; after the migration completes the guest is
// continued (`cont` from postmigrate reactivates the block nodes that the
// migration's completion inactivated). Without it QEMU quits and the
// instance ends (Requested).
func (in *instance) SaveState(ctx context.Context, dir string, o runtime.SaveOptions) (err error) {
	if o.KeepRunning && o.NewRootDisk == "" {
		return fmt.Errorf("%w: save state: KeepRunning needs NewRootDisk", errdefs.ErrInvalid)
	}
	in.mu.Lock()
	q, state := in.qmp, in.state
	in.mu.Unlock()
	if state != stateRunning || q == nil {
		return fmt.Errorf("save state: %w", runtime.ErrNotRunning)
	}
	if in.spec.RootDisk == "" {
		return fmt.Errorf("%w: save state: instance has no root disk", errdefs.ErrFailedPrecondition)
	}
	if ents, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("save state dir: %w", err)
	} else if len(ents) > 0 {
		return fmt.Errorf("%w: save state dir is not empty", errdefs.ErrInvalid)
	}
	var newDisk *os.File
	if o.KeepRunning {
		if newDisk, err = os.OpenFile(o.NewRootDisk, os.O_RDWR, 0); err != nil {
			return fmt.Errorf("save state: new root disk: %w", err)
		}
		defer newDisk.Close()
	}
	defer func() {
		if err != nil {
			// A half-written snapshot must not be used.
			for _, n := range []string{snapState, snapMeta} {
				_ = os.Remove(filepath.Join(dir, n))
			}
		}
	}()
	// See SaveSnapshot: the guest must see the agent disconnect first.
	if err := clock.Sleep(ctx, snapshotSettle); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	t0 := time.Now()
	if err := q.Execute(ctx, "migrate-set-capabilities", json.RawMessage(noIgnoreShared), nil); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": migrateBandwidth}, nil); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, snapState), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer f.Close()
	if err := q.SendFD(ctx, "state", f); err != nil {
		return fmt.Errorf("save state: %w", err)
	}

	// From `stop` on, a failure resumes the guest (live snapshot) or ends
	// the instance (pause).
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	fail := func(err error) error {
		if o.KeepRunning {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			cerr := q.Execute(cctx, "cont", nil, nil)
			cancel()
			if cerr == nil {
				return fmt.Errorf("save state: %w", err)
			}
			in.log.Warn("resume after failed save", "err", cerr)
		}
		in.kill(true)
		<-in.done
		return fmt.Errorf("save state: %w", err)
	}
	stopped := time.Now()
	if o.KeepRunning {
		if err := in.switchRootDisk(ctx, q, newDisk); err != nil {
			return fail(err)
		}
	}
	if err := q.Execute(ctx, "migrate", map[string]string{"uri": "fd:state"}, nil); err != nil {
		return fail(err)
	}
	if err := waitMigration(ctx, q, "completed"); err != nil {
		return fail(err)
	}
	migrated := time.Since(stopped)
	var resumed time.Duration
	if o.KeepRunning {
		// The stream holds the agent port closed (the caller closed it);
		// the running guest gets a new channel, opened when it resumes.
		if err := in.newAgentChannel(); err != nil {
			in.log.Warn("new agent channel after live snapshot", "err", err)
		}
		if err := q.Execute(ctx, "cont", nil, nil); err != nil {
			in.kill(true)
			<-in.done
			return fmt.Errorf("save state: resume: %w", err)
		}
		resumed = time.Since(stopped)
	} else {
		// The source sits in postmigrate; end it. quit flushes the disk.
		in.quitMigrated(ctx, q)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	size := int64(-1)
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	// Restores take a qcow2 overlay on the frozen disk, whatever its format.
	if err := in.writeMeta(dir, kindFull, "qcow2", q.Version().String(), snapState); err != nil {
		return err
	}
	in.log.Info("state saved", "keep_running", o.KeepRunning, "migrate", migrated, "paused_for", resumed,
		"state_bytes", size, "total", time.Since(t0))
	return nil
}

// switchRootDisk makes disk (a qcow2 overlay on the current root disk) the
// root disk's active layer: add-fd, blockdev-add with no backing link, then
// blockdev-snapshot, which links the current node under it. The guest must
// be stopped.
func (in *instance) switchRootDisk(ctx context.Context, q *qmp.Client, disk *os.File) error {
	var added struct {
		FDSet int `json:"fdset-id"`
	}
	if err := q.ExecuteFD(ctx, "add-fd", map[string]any{}, &added, disk); err != nil {
		return fmt.Errorf("new root disk: %w", err)
	}
	in.mu.Lock()
	old := in.rootNode
	node := fmt.Sprintf("root-%d", in.diskGen+1)
	in.mu.Unlock()
	add := map[string]any{
		"driver":    "qcow2",
		"node-name": node,
		"file":      map[string]any{"driver": "file", "filename": fmt.Sprintf("/dev/fdset/%d", added.FDSet), "locking": "off"}, // as the root disk's (args.go)
		"backing":   nil,
	}
	if err := q.Execute(ctx, "blockdev-add", add, nil); err != nil {
		_ = q.Execute(ctx, "remove-fd", map[string]any{"fdset-id": added.FDSet}, nil)
		return fmt.Errorf("new root disk: %w", err)
	}
	if err := q.Execute(ctx, "blockdev-snapshot", map[string]any{"node": old, "overlay": node}, nil); err != nil {
		_ = q.Execute(ctx, "blockdev-del", map[string]any{"node-name": node}, nil)
		_ = q.Execute(ctx, "remove-fd", map[string]any{"fdset-id": added.FDSet}, nil)
		return fmt.Errorf("new root disk: %w", err)
	}
	in.mu.Lock()
	in.rootNode = node
	in.diskGen++
	in.mu.Unlock()
	return nil
}

// newAgentChannel connects to the agent's listening socket again (QEMU
// accepts once the previous connection is gone) and makes it the one
// AgentConn hands out next.
func (in *instance) newAgentChannel() error {
	host, err := dialAgent(in.spec.RunDir)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.reaped {
		host.Close()
		return runtime.ErrNotRunning
	}
	if in.agent != nil {
		in.agent.Close()
	}
	in.agent, in.agentTaken = host, false
	return nil
}
