package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// TestSavedExecsRoundTrip: what a pause saves of an exec (its output
// within the budget, the newest first, its limits and exit) reads back the
// same, and the session rebuilt from it replays that output.
func TestSavedExecsRoundTrip(t *testing.T) {
	t.Parallel()
	out := func(stderr bool, s string) *agentv1.ExecResponse {
		if stderr {
			return &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: []byte(s)}}
		}
		return &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: []byte(s)}}
	}
	parked := &session{id: guest.NewExecID(), argv: []string{"sh", "-c", "x"}, pid: 42, stdin: true, tenant: "t1", keyID: "k1",
		startedAt: time.Unix(1700000000, 0).UTC(), parked: true, dropped: 3,
		out: []*agentv1.ExecResponse{out(false, "old-"), out(true, "err-"), out(false, "newest")}}
	parked.g = &guardedExec{limit: 1000, sent: 17, truncated: false}
	done := &session{id: guest.NewExecID(), argv: []string{"true"}, pid: 7, startedAt: time.Unix(1700000001, 0).UTC(),
		endedAt: time.Unix(1700000002, 0).UTC(), exit: &agentv1.ExecExited{ExitCode: 3, DurationMs: 12, OomKilled: true},
		out: []*agentv1.ExecResponse{out(false, "done")}}

	// A budget of 8 bytes keeps "newest" (6) and drops the rest of the
	// parked exec's (the next chunk would not fit).
	sv1, used1 := parked.save(8)
	sv2, used2 := done.save(10)
	if used1 != 6 || used2 != 4 {
		t.Fatalf("used %d and %d bytes of the budget; want 6 and 4", used1, used2)
	}
	if sv1.Dropped != 3+8 || len(sv1.Output) != 1 || string(sv1.Output[0].Data) != "newest" || sv1.Limit != 1000 || sv1.Sent != 17 {
		t.Fatalf("saved parked exec: %+v", sv1)
	}
	dir := t.TempDir()
	if err := writeSavedExecs(dir, []savedExec{sv1, sv2}); err != nil {
		t.Fatal(err)
	}
	got, err := readSavedExecs(dir)
	if err != nil || len(got) != 2 {
		t.Fatalf("read back %d execs, %v", len(got), err)
	}
	if got[0].ID != parked.id || got[0].Exit != nil || got[0].Tenant != "t1" || got[0].KeyID != "k1" || !got[0].Stdin || got[0].PID != 42 {
		t.Errorf("parked exec read back as %+v", got[0])
	}
	if x := got[1].Exit; x == nil || x.Code != 3 || !x.OOMKilled || x.DurationMs != 12 || !got[1].EndedAt.Equal(done.endedAt) {
		t.Errorf("finished exec read back as %+v (exit %+v)", got[1], got[1].Exit)
	}
	tab := &sessions{retainCap: retainCap}
	s := tab.savedSession(got[0])
	if s.outBytes != 6 || s.dropped != 11 || string(s.out[0].GetStdout()) != "newest" {
		t.Errorf("rebuilt session: %d bytes, %d dropped, %v", s.outBytes, s.dropped, s.out)
	}
}

// TestSavedExecsHostile: records that do not hold are dropped, an
// unreadable file is an error (the resume goes on without them), and a
// missing one is no execs.
func TestSavedExecsHostile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if got, err := readSavedExecs(dir); err != nil || got != nil {
		t.Fatalf("no file: %v, %v", got, err)
	}
	good := guest.NewExecID()
	body := `[{"id":"../../etc","argv":["x"]},{"id":"` + good + `","argv":[]},{"id":"` + good + `","argv":["sleep","9"],"pid":5}]`
	if err := os.WriteFile(filepath.Join(dir, statedir.PausedExecsFile), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readSavedExecs(dir)
	if err != nil || len(got) != 1 || got[0].ID != good || got[0].PID != 5 {
		t.Fatalf("kept %+v, %v; want only the valid record", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, statedir.PausedExecsFile), []byte(`{"not":"a list"`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readSavedExecs(dir); err == nil || !strings.Contains(err.Error(), "saved execs") {
		t.Fatalf("a broken file: %v", err)
	}
	// Output beyond the retain cap is counted as dropped, not kept.
	tab := &sessions{retainCap: 8}
	s := tab.savedSession(savedExec{ID: good, Argv: []string{"x"}, Output: []savedChunk{{Data: []byte("12345")}, {Data: []byte("678901")}}})
	if s.outBytes != 5 || s.dropped != 6 {
		t.Errorf("over the cap: kept %d bytes, dropped %d", s.outBytes, s.dropped)
	}
}
