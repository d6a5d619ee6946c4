package shim

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
)

func TestFilesThroughShimAndManager(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	m := h.manager()
	ctx := t.Context()
	c := sandbox.Local()

	if err := m.Mkdir(ctx, c, h.id, "/srv/a", true); err != nil {
		t.Fatal(err)
	}
	n, err := m.WriteFile(ctx, c, h.id, "/srv/a/f.txt", 0o600, strings.NewReader("hello"))
	if err != nil || n != 5 {
		t.Fatalf("write: %d %v", n, err)
	}
	fi, err := m.StatFile(ctx, c, h.id, "/srv/a/f.txt")
	if err != nil || fi.Type != guest.FileRegular || fi.Size != 5 || fi.Name != "f.txt" || fi.Path != "/srv/a/f.txt" {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	ls, err := m.ListFiles(ctx, c, h.id, "/srv", 2)
	if err != nil || len(ls.Entries) != 2 || ls.Truncated {
		t.Fatalf("list: %+v %v", ls, err)
	}
	types := map[string]guest.FileType{}
	for _, e := range ls.Entries {
		types[e.Path] = e.Type
	}
	if types["/srv/a"] != guest.FileDirectory || types["/srv/a/f.txt"] != guest.FileRegular {
		t.Fatalf("list types: %v", types)
	}
	var out bytes.Buffer
	var info guest.FileInfo
	n, err = m.ReadFile(ctx, c, h.id, "/srv/a/f.txt", &out, func(fi guest.FileInfo) { info = fi })
	if err != nil || n != 5 || out.String() != "hello" || info.Size != 5 {
		t.Fatalf("read: %d %q %+v %v", n, out.String(), info, err)
	}
	// The shim's client refuses more than the limit (the manager's is the
	// sandbox's disk size).
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	out.Reset()
	if _, err := sc.ReadFile(ctx, "/srv/a/f.txt", 3, &out, nil); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("read past the limit: %v", err)
	}
	if _, err := m.StatFile(ctx, c, h.id, "/nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat missing: %v", err)
	}
	// Host-side validation, before the guest.
	if _, err := m.StatFile(ctx, c, h.id, "/srv/../etc"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unclean path: %v", err)
	}
	if err := m.RemoveFile(ctx, c, h.id, "/srv/a", false); err == nil {
		t.Fatal("removed a non-empty directory without recursive")
	}
	if err := m.RemoveFile(ctx, c, h.id, "/srv/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.StatFile(ctx, c, h.id, "/srv/a/f.txt"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
	// Another tenant cannot see the sandbox: the same answer as a missing one.
	other := sandbox.Caller{Tenant: "other"}
	if _, err := m.StatFile(ctx, other, h.id, "/"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant: %v", err)
	}
	// Every call of this client shared one connection.
	if sc.Dials() != 1 {
		t.Fatalf("%d dials", sc.Dials())
	}
	h.stop(t)
}

func TestLifecycleTouchAndStats(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	ctx := t.Context()
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	st, err := sc.Stats(ctx)
	if err != nil || st.Runtime != h.rt.Name() || st.RunningSince.IsZero() || st.RunningExecs != 0 || st.RequestsInFlight != 0 {
		t.Fatalf("stats: %+v %v", st, err)
	}
	// Stats is not activity; Touch is.
	before := st.LastActivity
	again, err := sc.Stats(ctx)
	if err != nil || !again.LastActivity.Equal(before) {
		t.Fatalf("stats moved the activity clock: %v -> %v (%v)", before, again.LastActivity, err)
	}
	h.clk.Advance(time.Second) // activity is timed on the shim's clock
	if err := h.manager().Touch(ctx, sandbox.Local(), h.id); err != nil {
		t.Fatal(err)
	}
	after, err := sc.Stats(ctx)
	if err != nil || !after.LastActivity.After(before) {
		t.Fatalf("touch did not move the activity clock: %v -> %v (%v)", before, after.LastActivity, err)
	}
	h.stop(t)
}
