package e2b

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func TestEnvdWatch(t *testing.T) {
	h := newHarness(t)
	sb := h.envdSandbox()
	fc := filesystemconnect.NewFilesystemClient(h.envdHTTP(sb.SandboxID, *sb.EnvdAccessToken), h.url, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	write := func(p string) {
		if _, err := h.files.WriteFile(ctx, sandbox.Caller{}, sb.SandboxID, p, 0o644, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}

	// Streaming (the JS SDK's watchDir): start first, then the events.
	st, err := fc.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "/dir"}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("first message: %v %v", st.Msg(), st.Err())
	}
	write("/dir/a.txt")
	write("/elsewhere/b.txt")
	write("/dir/c.txt")
	var got []string
	for len(got) < 2 && st.Receive() {
		if e := st.Msg().GetFilesystem(); e != nil {
			got = append(got, e.GetType().String()+" "+e.GetName())
		}
	}
	if strings.Join(got, ",") != "EVENT_TYPE_CREATE a.txt,EVENT_TYPE_CREATE c.txt" {
		t.Fatalf("events %v (%v)", got, st.Err())
	}
	st.Close()
	// A file or a missing path is refused before any watch.
	for p, code := range map[string]connect.Code{"/dir/a.txt": connect.CodeInvalidArgument, "/nope": connect.CodeNotFound} {
		w, err := fc.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: p}))
		if err == nil {
			for w.Receive() {
			}
			err = w.Err()
		}
		if connect.CodeOf(err) != code {
			t.Errorf("watch %s: %v, want %v", p, err, code)
		}
	}

	// Polling (the Python SDK's sync watch_dir).
	cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/dir"}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	write("/dir/d.txt")
	var events []*filesystem.FilesystemEvent
	for deadline := time.Now().Add(10 * time.Second); len(events) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ev, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, ev.Msg.GetEvents()...)
	}
	if len(events) != 1 || events[0].GetName() != "d.txt" {
		t.Fatalf("polled events: %v", events)
	}
	// Another sandbox's token does not reach this sandbox's watcher.
	other := h.envdSandbox()
	oc := filesystemconnect.NewFilesystemClient(h.envdHTTP(other.SandboxID, *other.EnvdAccessToken), h.url, connect.WithProtoJSON())
	if _, err := oc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("another sandbox's poll: %v", err)
	}
	if _, err := fc.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("poll of a removed watcher: %v", err)
	}
}
