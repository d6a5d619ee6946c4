package shim

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// startGate holds the fake guest's interpreter starts while closed.
type startGate struct {
	mu      sync.Mutex
	release chan struct{} // nil: starts go through
	started chan string
}

func (g *startGate) hook(lang string) {
	g.mu.Lock()
	release := g.release
	g.mu.Unlock()
	if release == nil {
		return
	}
	g.started <- lang
	<-release
}

// hold makes the next starts wait until the returned func is called.
func (g *startGate) hold() func() {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := make(chan struct{})
	g.release = ch
	return func() {
		g.mu.Lock()
		g.release = nil
		g.mu.Unlock()
		close(ch)
	}
}

// asyncRun runs code in the background; its events arrive on events (the
// channel is closed after the last), its error on done.
func asyncRun(t *testing.T, m *sandbox.Manager, id string, req guest.CodeRequest) (<-chan guest.CodeEvent, <-chan error) {
	events := make(chan guest.CodeEvent, 64)
	done := make(chan error, 1)
	go func() {
		defer close(events)
		done <- m.RunCode(t.Context(), sandbox.Local(), id, req, func(ev guest.CodeEvent) error {
			events <- ev
			return nil
		})
	}()
	return events, done
}

// next returns the next event, failing the test after a minute.
func next(t *testing.T, events <-chan guest.CodeEvent) guest.CodeEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("the run ended early")
		}
		return ev
	case <-time.After(time.Minute):
		t.Fatal("no event for a minute")
	}
	return guest.CodeEvent{}
}

// TestRunCodeProgressAndRestart: a run that waits for its context's
// interpreter gets status events until it starts (#21 item 2), and a dead
// context comes back on the next run, which says so first and why it had
// died (#21 item 5); contexts ls says how a dead one ended.
func TestRunCodeProgressAndRestart(t *testing.T) {
	t.Parallel()
	// The system clock: the restarts below are held past a run's timeout
	// plus a short grace, in real time, and must not count against it.
	h := newHarness(t, time.Hour, func(_ *store.Sandbox, c *Config) {
		c.Clock = clock.Real{}
		c.serving = func(s *shim) { s.contexts.grace = 50 * time.Millisecond }
	})
	m := h.manager()
	m.ContextProgress = sandbox.ContextProgress{Delay: time.Millisecond, Every: 10 * time.Millisecond}
	gate := &startGate{started: make(chan string, 8)}
	h.rt.SetContextStartHook(gate.hook)

	// The default context starts: "starting", then "still starting (Ns)"
	// until the interpreter is up, and only then the run's own events.
	release := gate.hold()
	events, done := asyncRun(t, m, h.id, guest.CodeRequest{Code: "x = 20\nprint(x + 1)"})
	if lang := <-gate.started; lang != "python" {
		t.Fatalf("started %q", lang)
	}
	if ev := next(t, events); ev.Kind != guest.EventStatus || ev.Status != "starting python context" {
		t.Fatalf("first event: %+v", ev)
	}
	if ev := next(t, events); ev.Kind != guest.EventStatus || !strings.HasPrefix(ev.Status, "still starting python context (") {
		t.Fatalf("second event: %+v", ev)
	}
	release()
	var stdout bytes.Buffer
	for ev := range events {
		switch ev.Kind {
		case guest.EventStatus:
			if stdout.Len() > 0 {
				t.Errorf("status after the run's output: %q", ev.Status)
			}
		case guest.EventStdout:
			stdout.Write(ev.Data)
		}
	}
	if err := <-done; err != nil || stdout.String() != "21\n" {
		t.Fatalf("first run: %v, stdout %q", err, stdout.String())
	}
	list, err := m.ListContexts(t.Context(), sandbox.Local(), h.id)
	if err != nil || len(list) != 1 || list[0].ID != "default-python" || !list[0].IsDefault || list[0].Exit != nil {
		t.Fatalf("contexts after the first run: %+v %v", list, err)
	}

	// A context that is up gets no status.
	r, err := runCode(t, m, h.id, guest.CodeRequest{Code: "x"})
	if err != nil || len(r.results) != 1 || string(r.results[0].Data["text/plain"]) != "20" {
		t.Fatalf("x: %+v %v", r, err)
	}

	// The restart does not count against the run's timeout (the shim's
	// deadline is the timeout plus timeoutGrace): the first case holds it
	// for over a second, past a 100 ms timeout.
	for i, tc := range []struct{ code, reason string }{
		{"kill(9)", "killed by signal 9"},
		{"oom()", "out of memory"},
		{"exit(3)", "exit code 3"},
	} {
		r, err := runCode(t, m, h.id, guest.CodeRequest{Code: "x = 5\n" + tc.code})
		if err != nil || len(r.errs) != 1 || r.errs[0].Name != "ContextDied" || !strings.Contains(r.errs[0].Value, tc.reason) {
			t.Fatalf("%s: errs %v, %v", tc.code, r.errs, err)
		}
		list, err := m.ListContexts(t.Context(), sandbox.Local(), h.id)
		if err != nil || len(list) != 1 || list[0].State != "dead" || list[0].Exit.Reason() != tc.reason {
			t.Fatalf("%s: contexts %+v %v", tc.code, list, err)
		}
		release := gate.hold()
		events, done := asyncRun(t, m, h.id, guest.CodeRequest{Code: "x", Timeout: 100 * time.Millisecond})
		<-gate.started
		if ev := next(t, events); ev.Kind != guest.EventStatus || ev.Status != "restarting python context default-python (it had died: "+tc.reason+")" {
			t.Fatalf("%s: first event: %+v", tc.code, ev)
		}
		if ev := next(t, events); ev.Kind != guest.EventStatus || !strings.HasPrefix(ev.Status, "still starting python context (") {
			t.Fatalf("%s: second event: %+v", tc.code, ev)
		}
		for i == 0 {
			if ev := next(t, events); ev.Kind != guest.EventStatus || ev.Status == "still starting python context (1s)" {
				break
			}
		}
		release()
		ev := next(t, events)
		for ev.Kind == guest.EventStatus {
			ev = next(t, events)
		}
		want := "[airlock: the python context had died (" + tc.reason + "); it was restarted and its state is lost]\n"
		if ev.Kind != guest.EventStderr || string(ev.Data) != want {
			t.Fatalf("%s: first output %+v, want stderr %q", tc.code, ev, want)
		}
		var names []string
		for ev := range events {
			if ev.Kind == guest.EventStatus {
				t.Errorf("%s: status after the output: %q", tc.code, ev.Status)
			}
			if ev.Kind == guest.EventError {
				names = append(names, ev.Error.Name)
			}
			if ev.Kind == guest.EventEnd && ev.End.TimedOut {
				t.Errorf("%s: the restart counted against the run's timeout", tc.code)
			}
		}
		if err := <-done; err != nil || len(names) != 1 || names[0] != "NameError" {
			t.Fatalf("%s: the restarted context kept its state or failed: %v %v", tc.code, names, err)
		}
	}

	// A quick start (the default delay) sends no status.
	m.ContextProgress = sandbox.ContextProgress{}
	var statuses []string
	err = m.RunCode(t.Context(), sandbox.Local(), h.id, guest.CodeRequest{Code: "echo hi", Language: "bash"}, func(ev guest.CodeEvent) error {
		if ev.Kind == guest.EventStatus {
			statuses = append(statuses, ev.Status)
		}
		return nil
	})
	if err != nil || len(statuses) != 0 {
		t.Fatalf("quick start: statuses %q, %v", statuses, err)
	}

	// A client that goes away during the wait ends the run with its error.
	m.ContextProgress = sandbox.ContextProgress{Delay: time.Millisecond, Every: 10 * time.Millisecond}
	release = gate.hold()
	gone := errors.New("client gone")
	errc := make(chan error, 1)
	go func() {
		errc <- m.RunCode(t.Context(), sandbox.Local(), h.id, guest.CodeRequest{Code: "1", Language: "javascript"}, func(ev guest.CodeEvent) error {
			return gone
		})
	}()
	// The context's start reaches the guest (and waits there), unless the
	// client's error at the first status ended the run before it got
	// there (a loaded machine): either way the run ends with that error.
	select {
	case <-gate.started:
	case err := <-errc:
		errc <- err
	case <-time.After(time.Minute):
		t.Fatal("the run of a gone client neither started its context nor ended")
	}
	select {
	case err := <-errc:
		if !errors.Is(err, gone) {
			t.Fatalf("run of a gone client: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the run of a gone client did not end")
	}
	release()
	h.stop(t)
}

// TestRunCodeReturnFiles: return_files sends the image files the run
// wrote (not those it left alone, not other files) as results before the
// end, with their paths relative to the context's directory.
func TestRunCodeReturnFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	m := h.manager()
	ctx := t.Context()
	for _, p := range []string{"/root/old.png", "/root/notes.txt"} {
		if _, err := m.WriteFile(ctx, sandbox.Local(), h.id, p, 0o644, bytes.NewReader(fake.FakePNG)); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Mkdir(ctx, sandbox.Local(), h.id, "/root/out", false); err != nil {
		t.Fatal(err)
	}
	var files []string
	var sawEnd bool
	err := m.RunCode(ctx, sandbox.Local(), h.id, guest.CodeRequest{
		Code:        "savefig(\"plot.png\")\nsavefig(\"out/b.png\")\nsavefig(\"/tmp/c.png\")\nsavefig(\"skip.jpg\")",
		ReturnFiles: []string{"*.png", "out/*", "/tmp/*.png", "*.txt"},
	}, func(ev guest.CodeEvent) error {
		switch ev.Kind {
		case guest.EventResult:
			if sawEnd {
				t.Error("a result after the end")
			}
			if !bytes.Equal(ev.Result.Data["image/png"], fake.FakePNG) {
				t.Errorf("file %s: %v", ev.Result.File, ev.Result.Data)
			}
			files = append(files, ev.Result.File)
		case guest.EventEnd:
			sawEnd = true
		}
		return nil
	})
	if err != nil || !sawEnd {
		t.Fatalf("run: %v (end %v)", err, sawEnd)
	}
	if strings.Join(files, " ") != "out/b.png plot.png /tmp/c.png" {
		t.Fatalf("returned %q, want out/b.png plot.png /tmp/c.png", files)
	}
	// Without return_files, nothing comes back; a bad pattern is refused.
	r, err := runCode(t, m, h.id, guest.CodeRequest{Code: "savefig(\"again.png\")"})
	if err != nil || len(r.results) != 0 {
		t.Fatalf("run without return_files: %+v %v", r.results, err)
	}
	if _, err := runCode(t, m, h.id, guest.CodeRequest{Code: "1", ReturnFiles: []string{"[a"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad pattern: %v", err)
	}
	h.stop(t)
}
