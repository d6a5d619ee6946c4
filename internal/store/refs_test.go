package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// chain is a state dir's worth of disk references, built through the
// store's API the way the sandbox manager builds them:
//
//	template T <- sandbox A
//	A forked: fork base F1 (holds T); A, B, C on F1 (B, C also on F1's
//	template TF1)
//	B forked: fork base F2 (holds F1, TF1); D on F2
//	C snapshotted as the named snapshot N (holds F1, TF1)
//
// The candidates of collection are F1, F2 and T (a stale template);
// N is named (removed by its user only), TF1 goes with F1.
type chain struct {
	s     *Store
	edges map[Obj][]Obj // holder -> targets, as built
}

var (
	objT   = TemplateObj("T")
	objTF1 = TemplateObj("TF1")
	objF1  = SnapshotObj("F1")
	objF2  = SnapshotObj("F2")
	objN   = SnapshotObj("N")
	cands  = []Obj{objF1, objF2, objT}
)

func buildChain(t *testing.T) *chain {
	t.Helper()
	ctx := t.Context()
	c := &chain{s: openTest(t), edges: map[Obj][]Obj{}}
	add := func(holder Obj, role Role, targets ...Obj) {
		t.Helper()
		if err := c.s.AddRefs(ctx, holder, role, targets...); err != nil {
			t.Fatal(err)
		}
	}
	snap := func(sid, name, of string) {
		t.Helper()
		if err := c.s.RecordSnapshot(ctx, Snapshot{ID: sid, Name: name, SandboxID: of, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"A", "B", "C", "D"} {
		newRow(t, c.s, id, StateRunning)
	}
	add(SandboxObj("A"), RoleDisk, objT)
	snap("F1", "_fork-1", "A")
	for _, id := range []string{"B", "C"} {
		add(SandboxObj(id), RoleOrigin, objF1)
		add(SandboxObj(id), RoleDisk, objF1, objTF1)
	}
	snap("F2", "_fork-2", "B")
	add(SandboxObj("D"), RoleOrigin, objF2)
	add(SandboxObj("D"), RoleDisk, objF2)
	snap("N", "named", "C")
	// What the store recorded must be the chain above.
	want := map[Obj][]Obj{
		SandboxObj("A"): {objF1, objT},
		SandboxObj("B"): {objF1, objF2, objTF1},
		SandboxObj("C"): {objF1, objN, objTF1},
		SandboxObj("D"): {objF2},
		objF1:           {objT},
		objF2:           {objF1, objTF1},
		objN:            {objF1, objTF1},
	}
	for h, w := range want {
		got, err := c.s.Targets(ctx, h, "")
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(w, func(a, b Obj) int { return compareObj(a, b) })
		if !slices.Equal(got, w) {
			t.Fatalf("%s holds %v, want %v", h, got, w)
		}
		c.edges[h] = w
	}
	return c
}

func compareObj(a, b Obj) int {
	if a.Kind != b.Kind {
		if a.Kind < b.Kind {
			return -1
		}
		return 1
	}
	switch {
	case a.ID < b.ID:
		return -1
	case a.ID > b.ID:
		return 1
	}
	return 0
}

// reachable is what the live roots keep, by walking the edges.
func (c *chain) reachable(roots []Obj) map[Obj]bool {
	seen := map[Obj]bool{}
	var walk func(Obj)
	walk = func(o Obj) {
		if seen[o] {
			return
		}
		seen[o] = true
		for _, t := range c.edges[o] {
			walk(t)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return seen
}

func permutations(xs []string) [][]string {
	if len(xs) <= 1 {
		return [][]string{slices.Clone(xs)}
	}
	var out [][]string
	for i := range xs {
		rest := append(slices.Clone(xs[:i]), xs[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]string{xs[i]}, p...))
		}
	}
	return out
}

// TestCollectFreesChainsWithLastHolder removes the holders of the chain in
// every order (each a parallel subtest on its own catalog) and collects
// after each removal: each candidate is released exactly when the last
// live sandbox or named snapshot that reaches it goes, never before, and
// only once.
func TestCollectFreesChainsWithLastHolder(t *testing.T) {
	holders := []string{"A", "B", "C", "D", "N"}
	for _, order := range permutations(holders) {
		t.Run(strings.Join(order, ""), func(t *testing.T) {
			t.Parallel()
			c := buildChain(t)
			ctx := t.Context()
			live := map[string]bool{"A": true, "B": true, "C": true, "D": true, "N": true}
			released := map[Obj]bool{}
			if got, err := c.s.Collect(ctx, cands); err != nil || len(got) != 0 {
				t.Fatalf("%v: collect with every holder alive: %v, %v", order, got, err)
			}
			var steps []string
			for _, h := range order {
				// C's disk is backed by N: N goes after C (and is refused
				// before, which is checked below).
				if h == "N" && slices.Index(order, "C") > slices.Index(order, "N") {
					continue
				}
				steps = append(steps, h)
				if h == "C" && slices.Index(order, "N") < slices.Index(order, "C") {
					steps = append(steps, "N")
				}
			}
			for step, h := range steps {
				if h == "N" {
					if _, err := c.s.DeleteSnapshot(ctx, "", "named"); err != nil {
						t.Fatalf("%v: rm N: %v", order, err)
					}
				} else if err := c.s.DeleteSandbox(ctx, h); err != nil {
					t.Fatal(err)
				}
				delete(live, h)
				if live["N"] && live["C"] {
					if _, err := c.s.DeleteSnapshot(ctx, "", "named"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
						t.Fatalf("%v: rm N while C is backed by it: %v", order, err)
					}
				}
				var roots []Obj
				for id := range live {
					if id == "N" {
						roots = append(roots, objN)
					} else {
						roots = append(roots, SandboxObj(id))
					}
				}
				keep := c.reachable(roots)
				// The manager's candidates: fork bases with rows, templates
				// whose files are there; the snapshots are passed always.
				var now []Obj
				for _, o := range cands {
					if o.Kind == KindSnapshot || !released[o] {
						now = append(now, o)
					}
				}
				got, err := c.s.Collect(ctx, now)
				if err != nil {
					t.Fatal(err)
				}
				var want []Obj
				for _, o := range cands {
					if !keep[o] && !released[o] {
						want = append(want, o)
						released[o] = true
					}
				}
				slices.SortFunc(got, compareObj)
				slices.SortFunc(want, compareObj)
				if !slices.Equal(got, want) {
					t.Fatalf("order %v, after removing %s (step %d): released %v, want %v", order, h, step, got, want)
				}
				// What is kept keeps its row; what went lost it.
				for _, sid := range []string{"F1", "F2"} {
					var n int
					if err := c.s.db.QueryRowContext(ctx, `SELECT count(*) FROM snapshots WHERE id = ?`, sid).Scan(&n); err != nil {
						t.Fatal(err)
					}
					if (n == 1) != !released[SnapshotObj(sid)] {
						t.Fatalf("order %v step %d: %s row present = %v, released = %v", order, step, sid, n == 1, released[SnapshotObj(sid)])
					}
				}
			}
			if len(released) != len(cands) {
				t.Fatalf("order %v: released %v at the end", order, released)
			}
			var n int
			if err := c.s.db.QueryRowContext(ctx, `SELECT count(*) FROM refs`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("order %v: %d refs left (%v)", order, n, err)
			}
		})
	}
}

// TestRefsGuards: a held snapshot cannot be deleted, and a released one
// cannot be held again.
func TestRefsGuards(t *testing.T) {
	c := buildChain(t)
	ctx := t.Context()
	_, err := c.s.DeleteSnapshot(ctx, "", "_fork-1")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("rm of a held snapshot: %v", err)
	}
	// The refusal names each holder in the words a user acts on, never a
	// bare digest.
	for _, want := range []string{
		"sandbox A, which it was taken of", "sandbox B, which started from it", "sandbox C, which started from it",
		"the base of a fork of sandbox B", `snapshot "named", taken later on top of it`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
	for _, id := range []string{"A", "B", "C", "D"} {
		if err := c.s.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.s.DeleteSnapshot(ctx, "", "named"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.s.Collect(ctx, cands); err != nil || len(got) != 3 {
		t.Fatalf("collect: %v, %v", got, err)
	}
	newRow(t, c.s, "E", StateCreating)
	if err := c.s.AddRefs(ctx, SandboxObj("E"), RoleOrigin, objF2); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("holding a released snapshot: %v", err)
	}
	if ts, _ := c.s.Targets(ctx, SandboxObj("E"), ""); len(ts) != 0 {
		t.Fatalf("E holds %v", ts)
	}
}

// TestMigrateImportsRefFiles: opening a schema 5 catalog imports the
// reference files of older versions as rows.
func TestMigrateImportsRefFiles(t *testing.T) {
	sqliteOnly(t)
	ctx := t.Context()
	root := t.TempDir()
	path := filepath.Join(root, "catalog.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	for v := range 5 {
		if err := migrate(ctx, &database{sql: db}, root, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO sandboxes(id,state,image,image_digest,cpus,memory_mib,disk_mib,timeout_s,created_at,expires_at) VALUES('sb1','paused','base','',1,512,2048,60,0,0)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "sandboxes", "sb1", "snapshot.refs"), "s1\ns2\n")
	write(filepath.Join(root, "sandboxes", "sb1", "template.ref"), filepath.Join(root, "templates", "t1")+"\n")
	write(filepath.Join(root, "sandboxes", "sb1", "from.snapshot"), "s2\n")
	write(filepath.Join(root, "sandboxes", "gone", "snapshot.refs"), "s1\n") // no row: not imported
	write(filepath.Join(root, "snapshots", "s2", "snapshot.refs"), "s1\n")
	write(filepath.Join(root, "snapshots", "s2", "template.ref"), filepath.Join(root, "templates", "t1")+"\n")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sb, err := s.GetSandbox(ctx, "sb1")
	if err != nil || sb.Gen != 1 {
		t.Fatalf("migrated row: %+v, %v", sb, err)
	}
	check := func(h Obj, role Role, want ...Obj) {
		t.Helper()
		got, err := s.Targets(ctx, h, role)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s %s: %v, %v; want %v", h, role, got, err, want)
		}
	}
	check(SandboxObj("sb1"), RoleDisk, SnapshotObj("s1"), SnapshotObj("s2"), TemplateObj("t1"))
	check(SandboxObj("sb1"), RoleOrigin, SnapshotObj("s2"))
	check(SandboxObj("gone"), "")
	check(SnapshotObj("s2"), RoleDisk, SnapshotObj("s1"), TemplateObj("t1"))
	// Opening it again changes nothing.
	s2, err := Open(context.WithoutCancel(ctx), path)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	check(SandboxObj("sb1"), RoleDisk, SnapshotObj("s1"), SnapshotObj("s2"), TemplateObj("t1"))
}
