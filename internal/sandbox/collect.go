package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// Disk references are catalog rows (store.AddRefs): a sandbox holds the
// template and the snapshots its disk's qcow2 chain goes through and the
// snapshot it started from; a snapshot holds what the sandbox it was taken
// of held. collect is the one collector: Remove, RemoveSnapshot,
// PruneSnapshots and PruneTemplates all end with it.

// collect frees the fork bases (the unlisted snapshots forks start from)
// and the stale templates (built for another kernel, initramfs or template
// format, or half built over an hour ago) that nothing holds, and, through
// them, whatever only they held (store.Collect). extra are more
// candidates. It deletes their files and returns the bytes freed and what
// it released.
func (m *Manager) collect(ctx context.Context, extra ...store.Obj) (int64, []store.Obj, error) {
	snaps, err := m.Store.ListSnapshots(ctx, "", true)
	if err != nil {
		return 0, nil, err
	}
	cands := extra
	live := map[string]bool{}
	for _, sn := range snaps {
		live[snapshotTemplateID(sn.ID)] = true
		if strings.HasPrefix(sn.Name, forkPrefix) {
			cands = append(cands, store.SnapshotObj(sn.ID))
		}
	}
	if bc, err := m.L.LoadBootConfig(); err == nil {
		for _, id := range staleTemplates(m.L, bc) {
			// A live snapshot's template is rebuilt on its next use if
			// dropped: it goes with its snapshot (or PruneTemplates).
			if !live[id] {
				cands = append(cands, store.TemplateObj(id))
			}
		}
	}
	released, err := m.Store.Collect(ctx, cands)
	if err != nil {
		return 0, nil, err
	}
	var freed int64
	var errs []error
	for _, o := range released {
		switch o.Kind {
		case store.KindSnapshot:
			freed += dirUsage(m.L.SnapshotDir(o.ID)) + dirUsage(filepath.Join(m.L.Templates(), snapshotTemplateID(o.ID)))
			errs = append(errs, removeSnapshotTemplate(m.L, o.ID), os.RemoveAll(m.L.SnapshotDir(o.ID)))
		case store.KindTemplate:
			dir := filepath.Join(m.L.Templates(), o.ID)
			freed += dirUsage(dir)
			errs = append(errs, os.RemoveAll(dir))
			_ = os.Remove(dir + ".lock")
		}
	}
	return freed, released, errors.Join(errs...)
}

// Collect runs the collector (for remove paths outside the manager: a
// shim removing its sandbox at the end of its lifetime) and returns the
// bytes freed.
func (m *Manager) Collect(ctx context.Context) (int64, error) {
	freed, _, err := m.collect(ctx)
	return freed, err
}

// staleTemplates lists the ids of the templates that are not for bc (an
// upgrade left them behind) or were half built over an hour ago.
func staleTemplates(l Layout, bc BootConfig) []string {
	dirs, _ := filepath.Glob(filepath.Join(l.Templates(), "*"))
	var out []string
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "meta.json"))
		var m templateMeta
		stale := err != nil || json.Unmarshal(b, &m) != nil || m.Key.Kernel != bc.Kernel || m.Key.Initrd != bc.Initrd || m.Key.Format != templateFormat
		if !stale {
			continue
		}
		if err != nil && time.Since(fi.ModTime()) < time.Hour {
			continue // may be a build in progress
		}
		out = append(out, filepath.Base(d))
	}
	return out
}

// PruneTemplates removes templates built for another kernel or initramfs
// than the state dir's boot config (left behind by an upgrade), and
// half-built ones, unless a sandbox's or snapshot's disk is backed by them
// (a paused sandbox needs its chain whole to resume). Running clones are
// unaffected: their VMMs hold the files open. Fork bases nothing uses go
// too (the same collector). It returns how many templates it removed.
func (m *Manager) PruneTemplates(ctx context.Context) (int, error) {
	bc, err := m.L.LoadBootConfig()
	if err != nil {
		return 0, err
	}
	// Stale templates of live snapshots too: rebuilt on their next use.
	var extra []store.Obj
	for _, id := range staleTemplates(m.L, bc) {
		extra = append(extra, store.TemplateObj(id))
	}
	_, released, err := m.collect(ctx, extra...)
	n := 0
	for _, o := range released {
		if o.Kind == store.KindTemplate {
			n++
		}
	}
	return n, err
}

// log is m.Log, or a discarding logger if unset.
func (m *Manager) log() *slog.Logger {
	if m.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Log
}
