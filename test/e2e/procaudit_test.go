package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// procEvents returns sandbox id's proc.* events.
func procEvents(t *testing.T, e env, id string) []event {
	t.Helper()
	out := e.must(t, "events", "--sandbox", id, "--type", "proc", "--limit", "10000")
	var evs []event
	for l := range strings.Lines(out) {
		var ev event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("events: %v: %q", err, l)
		}
		evs = append(evs, ev)
	}
	return evs
}

func argvOf(ev event) []string {
	var argv []string
	a, _ := ev.Detail["argv"].([]any)
	for _, s := range a {
		str, _ := s.(string)
		argv = append(argv, str)
	}
	return argv
}

// TestProcAuditRecordsGuestPrograms: a program that a guest program
// starts (python's os.system -> sh -> id) is on record with its argv and
// parents; a tight exec loop leaves a bounded number of rows whose counts
// add up to its iterations. On both runtimes: from the guest agent under
// qemu, from gVisor's Sentry (runsc's runtime monitoring) under gvisor.
func TestProcAuditRecordsGuestPrograms(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	e.must(t, "exec", id, "--", "python3", "-c", "import os; os.system('id')")
	var py, sh, idExec, idExit event
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		for _, ev := range procEvents(t, e, id) {
			argv := argvOf(ev)
			switch {
			case ev.Action == "proc.exec" && slices.Equal(argv, []string{"python3", "-c", "import os; os.system('id')"}):
				py = ev
			case ev.Action == "proc.exec" && slices.Equal(argv, []string{"sh", "-c", "id"}):
				sh = ev
			case ev.Action == "proc.exec" && ev.Detail["path"] == "/usr/bin/id":
				idExec = ev
			case ev.Action == "proc.exit" && ev.Detail["path"] == "/usr/bin/id":
				idExit = ev
			}
		}
		return py.Action != "" && sh.Action != "" && idExec.Action != "" && idExit.Action != ""
	}) {
		t.Fatalf("python -> sh -> id not on record (python %v, sh %v, id %v, id exit %v):\n%s", py, sh, idExec, idExit, dumpEvents(procEvents(t, e, id)))
	}
	if evs := procEvents(t, e, id); hasEvent(evs, "proc.audit.off", "") {
		t.Errorf("proc.audit.off on a sandbox whose programs are on record:\n%s", dumpEvents(evs))
	}
	if !slices.Equal(argvOf(idExec), []string{"id"}) || idExec.Detail["uid"] != float64(0) || idExec.Detail["cwd"] == nil {
		t.Errorf("id's exec: %v", idExec.Detail)
	}
	if idExec.Detail["ppid"] != sh.Detail["pid"] || sh.Detail["ppid"] != py.Detail["pid"] || py.Detail["agent"] != true || sh.Detail["agent"] != nil {
		t.Errorf("parents: python %v, sh %v, id %v", py.Detail, sh.Detail, idExec.Detail)
	}
	if idExit.Detail["exit_code"] != float64(0) || idExit.Detail["pid"] != idExec.Detail["pid"] {
		t.Errorf("id's exit: %v", idExit.Detail)
	}

	// A tight loop: 300 execs are far past what a program gets in rows of
	// its own (3). (Under TCG each costs about 60 ms: 1,000 took 60 s.)
	n := 300
	start := time.Now()
	e.must(t, "exec", id, "--", "sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done", n))
	intervals := int(time.Since(start)/(30*time.Second)) + 2 // the shim folds per 30 s
	// Removing the sandbox writes its folded rows.
	e.must(t, "rm", id)
	var single, folded, dropped, rows int
	for _, ev := range procEvents(t, e, id) {
		count, _ := ev.Detail["count"].(float64)
		switch {
		case ev.Action == "proc.audit.dropped":
			dropped += int(count)
		case ev.Action != "proc.exec" || (ev.Detail["path"] != "/usr/bin/true" && ev.Detail["path"] != ""):
			// (A /bin/true that ended before the agent read /proc is on
			// record without its program: gone.)
			continue
		case ev.Detail["aggregated"] == true:
			folded += int(count)
		default:
			single++
		}
		rows++
	}
	// Every exec is counted (a few may be lost, and say so); the loop
	// takes at most 3 rows of its own and a folded row per interval, not
	// one per exec.
	t.Logf("%d execs in %d intervals: %d rows, %d recorded singly, %d folded, %d dropped", n, intervals, rows, single, folded, dropped)
	if single+folded > n+5 || single+folded+dropped < n {
		t.Errorf("the loop's %d execs: %d recorded singly, %d folded, %d dropped", n, single, folded, dropped)
	}
	if single > 3*intervals || rows > 5*intervals {
		t.Errorf("the loop's %d execs took %d rows (%d singly) in %d intervals", n, rows, single, intervals)
	}
}
