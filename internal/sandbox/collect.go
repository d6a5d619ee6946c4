package sandbox

import (
	"context"
	"log/slog"

	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// Disk references are catalog rows (store.AddRefs): a sandbox holds the
// template and the snapshots its disk's qcow2 chain goes through and the
// snapshot it started from; a snapshot holds what the sandbox it was taken
// of held. template.Collect is the one collector: Remove, RemoveSnapshot,
// PruneSnapshots and PruneTemplates all end with it (and a shim removing
// its sandbox at the end of its lifetime).

// collect runs the collector (template.Collect) on the manager's state dir
// and catalog, with extra candidates.
func (m *Manager) collect(ctx context.Context, extra ...store.Obj) (int64, []store.Obj, error) {
	return template.Collect(ctx, m.L, m.Store, extra...)
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
	for _, id := range template.Stale(m.L, bc) {
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
