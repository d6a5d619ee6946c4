package template

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// ForkPrefix starts the names of the unlisted snapshots that forks start
// from (fork bases): Collect frees them once nothing holds them.
const ForkPrefix = "_fork-"

// Collect frees the fork bases (the unlisted snapshots forks start from)
// and the stale templates (built for another kernel, initramfs or template
// format, or half built over an hour ago) that nothing holds, and, through
// them, whatever only they held (store.Collect). extra are more
// candidates. It deletes their files and returns the bytes freed and what
// it released. The control plane runs it after every remove and prune;
// a shim runs it after removing its sandbox at the end of its lifetime.
func Collect(ctx context.Context, l statedir.Layout, st *store.Store, extra ...store.Obj) (int64, []store.Obj, error) {
	snaps, err := st.ListSnapshots(ctx, "", true)
	if err != nil {
		return 0, nil, err
	}
	cands := extra
	live := map[string]bool{}
	for _, sn := range snaps {
		live[SnapshotID(sn.ID)] = true
		if strings.HasPrefix(sn.Name, ForkPrefix) {
			cands = append(cands, store.SnapshotObj(sn.ID))
		}
	}
	if bc, err := l.LoadBootConfig(); err == nil {
		for _, id := range Stale(l, bc) {
			// A live snapshot's template is rebuilt on its next use if
			// dropped: it goes with its snapshot (or PruneTemplates).
			if !live[id] {
				cands = append(cands, store.TemplateObj(id))
			}
		}
	}
	released, err := st.Collect(ctx, cands)
	if err != nil {
		return 0, nil, err
	}
	var freed int64
	var errs []error
	for _, o := range released {
		switch o.Kind {
		case store.KindSnapshot:
			freed += statedir.DirUsage(l.SnapshotDir(o.ID)) + statedir.DirUsage(filepath.Join(l.Templates(), SnapshotID(o.ID)))
			errs = append(errs, RemoveSnapshot(l, o.ID), os.RemoveAll(l.SnapshotDir(o.ID)))
		case store.KindTemplate:
			dir := filepath.Join(l.Templates(), o.ID)
			freed += statedir.DirUsage(dir)
			errs = append(errs, os.RemoveAll(dir))
			_ = os.Remove(dir + ".lock")
		}
	}
	return freed, released, errors.Join(errs...)
}

// Stale lists the ids of the templates that are not for bc (an
// upgrade left them behind) or were half built over an hour ago.
func Stale(l statedir.Layout, bc statedir.BootConfig) []string {
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
