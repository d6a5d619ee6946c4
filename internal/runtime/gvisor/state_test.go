package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// TestSaveStateAndRestore: a pause (SaveState) ends the sandbox, and a
// restore of its state, twice, brings back a process's memory and the
// writes to the root, each copy then on its own; a live save keeps the
// sandbox running and answering on a new session.
func TestSaveStateAndRestore(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t)
	spec.Network = true
	in, c := boot(t, f, spec)
	writeFile(t, c, "/root/marker", "written before the save")
	// A process the save must keep, with its memory: a shell variable
	// only it holds, which it writes out when the file it waits for
	// appears.
	r := run(t, c, "", "sh", "-c", "v=remembered-$$; (while [ ! -e /root/go ]; do sleep 0.1; done; echo $v > /root/out) </dev/null >/dev/null 2>&1 & echo started")
	if r.stdout != "started\n" {
		t.Fatalf("start the background process: %+v", r)
	}
	// A live save first: the sandbox goes on, on a new session.
	live := filepath.Join(t.TempDir(), "live")
	if err := os.Mkdir(live, 0o700); err != nil {
		t.Fatal(err)
	}
	c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := in.SaveState(ctx, live, runtime.SaveOptions{KeepRunning: true}); err != nil {
		t.Fatalf("live save: %v", err)
	}
	c = redial(t, in)
	if r := run(t, c, "", "cat", "/root/marker"); r.stdout != "written before the save" {
		t.Fatalf("after the live save: %+v", r)
	}
	if fi, err := os.Stat(filepath.Join(live, "checkpoint.img")); err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("the live save's image: %v %v", fi, err)
	}

	// Then a pause: the sandbox ends, as asked.
	paused := filepath.Join(t.TempDir(), "paused")
	if err := os.Mkdir(paused, 0o700); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := in.SaveState(ctx, paused, runtime.SaveOptions{}); err != nil {
		t.Fatalf("pause: %v", err)
	}
	st, err := in.Wait(ctx)
	if err != nil || !st.Requested {
		t.Fatalf("after the pause: %+v %v", st, err)
	}

	// Two restores of the pause, each its own copy.
	for i, name := range []string{"one", "two"} {
		rs := f.spec(t)
		rs.Network = true
		rs.RestoreFrom = paused
		_, rc := boot(t, f, rs)
		if r := run(t, rc, "", "cat", "/root/marker"); r.stdout != "written before the save" {
			t.Fatalf("restore %d: the root's write: %+v", i, r)
		}
		writeFile(t, rc, "/root/copy", name)
		if r := run(t, rc, "", "sh", "-c", "touch /root/go; for i in $(seq 50); do [ -s /root/out ] && break; sleep 0.1; done; cat /root/out"); !strings.HasPrefix(r.stdout, "remembered-") {
			t.Fatalf("restore %d: the background process's memory: %+v", i, r)
		}
		if r := run(t, rc, "", "cat", "/root/copy"); r.stdout != name {
			t.Fatalf("restore %d sees %q", i, r.stdout)
		}
	}
}

// redial takes the session AgentConn offers after a live save.
func redial(t *testing.T, in *instance) *agentapi.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := in.AgentConn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.AgentConn(ctx); err == nil {
		t.Error("a second AgentConn after one live save succeeded")
	}
	c, err := agentapi.Dial(ctx, conn, agentapi.Options{})
	if err != nil {
		conn.Close()
		t.Fatalf("agent dial after the live save: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
