package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// Execs across a pause. A pause parks each running exec in the guest (agent
// protocol 8: the agent keeps the process, blocked on its pipes, and ends
// the stream) and saves what the host knows of every exec (savedExec) in
// the pause directory. The shim that resumes the sandbox adopts the parked
// processes under their ids, with their retained output and the host-side
// limits where they stopped. A sandbox cloned from a snapshot (a fork)
// finds the processes parked in the snapshot's memory and adopts them too,
// from what its guest reports.

// Limits on parking and on the saved execs.
const (
	// parkWait bounds the wait for the agent to park every exec; one not
	// parked by then is killed.
	parkWait = 5 * time.Second
	// savedOutputBudget caps the output saved for all execs together; the
	// newest output is kept.
	savedOutputBudget = 16 << 20
	// maxSavedArgs and maxSavedArg bound the argv of an exec adopted from
	// what the guest reports (a fork's).
	maxSavedArgs = 64
	maxSavedArg  = 1024
)

// parkedEvent is the retained event that ends a parked exec's streams.
var parkedEvent = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Parked{Parked: &agentv1.ExecParked{}}}

// savedExec is an exec as a pause saves it: running (parked in the guest)
// when Exit is nil.
type savedExec struct {
	ID           string       `json:"id"`
	Argv         []string     `json:"argv"`
	PID          int32        `json:"pid"`
	Stdin        bool         `json:"stdin,omitempty"`
	TTY          bool         `json:"tty,omitempty"`
	Tenant       string       `json:"tenant,omitempty"`
	KeyID        string       `json:"key_id,omitempty"`
	StartedAt    time.Time    `json:"started_at"`
	Limit        uint64       `json:"limit,omitempty"`         // output cap
	Sent         uint64       `json:"sent,omitempty"`          // output forwarded so far
	Truncated    bool         `json:"truncated,omitempty"`     // output was dropped at the cap
	DeadlineLeft int64        `json:"deadline_left,omitempty"` // ns of the host deadline left; 0: none
	Output       []savedChunk `json:"output,omitempty"`
	Dropped      uint64       `json:"dropped,omitempty"`
	Exit         *savedExit   `json:"exit,omitempty"`
	EndedAt      time.Time    `json:"ended_at,omitzero"`
}

type savedChunk struct {
	Stderr bool   `json:"stderr,omitempty"`
	Data   []byte `json:"data"`
}

type savedExit struct {
	Code       int32 `json:"code"`
	Signal     int32 `json:"signal,omitempty"`
	TimedOut   bool  `json:"timed_out,omitempty"`
	Truncated  bool  `json:"truncated,omitempty"`
	DurationMs int64 `json:"duration_ms,omitempty"`
	OOMKilled  bool  `json:"oom_killed,omitempty"`
}

// CanPark reports whether a pause can park the running execs: the agent
// speaks protocol 8.
func (t *sessions) CanPark() bool {
	return t.agent.Require(agentapi.VersionPark, "parked execs") == nil
}

// Parkable counts the running execs a pause would park, and the client
// streams that follow them (they end with the pause): neither keeps a
// pause from parking.
func (t *sessions) Parkable() (execs, streams int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(t.running), t.streams.Load()
}

// Park parks every running exec in the guest and returns what the host
// knows of every exec, running ones first. Execs started with
// kill_on_detach are killed instead (their client goes away with the
// pause), as is one the agent does not park within parkWait. Start fails
// from now on; the caller closes the table after.
func (t *sessions) Park() []savedExec {
	t.mu.Lock()
	if !t.parking {
		t.parking = true
		close(t.gen.Load().parkCh)
	}
	all := make([]*session, 0, len(t.byID))
	for _, s := range t.byID {
		all = append(all, s)
	}
	t.mu.Unlock()
	// s.mu is taken outside t.mu (the order killIfDetachedLocked uses is
	// s.mu, then t.mu).
	var running []*session
	for _, s := range all {
		if s.state() == execRunning {
			running = append(running, s)
		}
	}
	for _, s := range running {
		if s.killOnDetach {
			s.kill("the sandbox was paused, and the exec was started to end with its client")
			continue
		}
		if err := s.g.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Park{Park: &agentv1.ExecPark{Token: s.id}}}); err != nil {
			t.log.Warn("park exec", "exec_id", s.id, "err", err) // its pump ends it
		}
	}
	deadline := t.clk.NewTimer(parkWait)
	defer deadline.Stop()
	for _, s := range running {
		select {
		case <-s.pumpDone:
			continue
		case <-deadline.C():
		}
		s.kill("the exec could not be parked for the pause")
		<-s.pumpDone
	}

	type entry struct {
		s      *session
		parked bool
	}
	t.mu.Lock()
	all = all[:0]
	for _, s := range t.byID {
		all = append(all, s)
	}
	t.mu.Unlock()
	entries := make([]entry, 0, len(all))
	for _, s := range all {
		entries = append(entries, entry{s, s.state() == execParked})
	}
	// Parked first, then the finished, newest first: the output budget
	// keeps theirs first.
	slices.SortFunc(entries, func(a, b entry) int {
		if a.parked != b.parked {
			if a.parked {
				return -1
			}
			return 1
		}
		return b.s.startedAt.Compare(a.s.startedAt)
	})
	budget := savedOutputBudget
	out := make([]savedExec, 0, len(all))
	for _, e := range entries {
		sv, used := e.s.save(budget)
		budget -= used
		out = append(out, sv)
	}
	return out
}

// Exec states as Park sees them.
const (
	execRunning = iota
	execParked
	execExited
)

func (s *session) state() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.exit != nil:
		return execExited
	case s.parked:
		return execParked
	}
	return execRunning
}

// kill ends s's stream (the agent kills the process) with why as the note
// its output ends with.
func (s *session) kill(why string) {
	s.mu.Lock()
	s.killNote = why
	s.mu.Unlock()
	s.g.Close()
}

// parked records that the agent parked s: its streams end with the parked
// event, and it no longer counts as running here.
func (t *sessions) parked(s *session, ev *agentv1.ExecResponse) {
	s.mu.Lock()
	s.parked = true
	s.endAttachersLocked(ev)
	s.mu.Unlock()
	t.mu.Lock()
	t.running--
	t.mu.Unlock()
	t.log.Debug("exec session parked", "exec_id", s.id, "pid", s.pid)
}

// save is s as a pause saves it, with at most budget bytes of its newest
// output; used is how many it took.
func (s *session) save(budget int) (sv savedExec, used int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv = savedExec{ID: s.id, Argv: s.argv, PID: s.pid, Stdin: s.stdin, TTY: s.tty, Tenant: s.tenant, KeyID: s.keyID,
		StartedAt: s.startedAt, Dropped: s.dropped, EndedAt: s.endedAt}
	if s.g != nil {
		sv.Limit, sv.Sent, sv.Truncated = s.g.limit, s.g.sent, s.g.truncated
		if s.parked {
			sv.DeadlineLeft = int64(s.g.left())
		}
	}
	if x := s.exit; x != nil {
		sv.Exit = &savedExit{Code: x.GetExitCode(), Signal: x.GetSignal(), TimedOut: x.GetTimedOut(), Truncated: x.GetOutputTruncated(),
			DurationMs: x.GetDurationMs(), OOMKilled: x.GetOomKilled()}
	}
	// The newest output within budget.
	i := len(s.out)
	for i > 0 && used+outputLen(s.out[i-1]) <= budget {
		i--
		used += outputLen(s.out[i])
	}
	for _, ev := range s.out[:i] {
		sv.Dropped += uint64(outputLen(ev))
	}
	for _, ev := range s.out[i:] {
		if b := ev.GetStderr(); b != nil {
			sv.Output = append(sv.Output, savedChunk{Stderr: true, Data: b})
		} else {
			sv.Output = append(sv.Output, savedChunk{Data: ev.GetStdout()})
		}
	}
	return sv, used
}

// writeSavedExecs writes execs into pause directory dir.
func writeSavedExecs(dir string, execs []savedExec) error {
	b, err := json.Marshal(execs)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, statedir.PausedExecsFile), b, 0o600)
}

// readSavedExecs reads the execs a pause saved in dir (none if it saved
// none). The host wrote them, but they are checked as if it had not: a
// record that does not hold is dropped.
func readSavedExecs(dir string) ([]savedExec, error) {
	f, err := os.Open(filepath.Join(dir, statedir.PausedExecsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var all []savedExec
	// The budget plus JSON's base64 and the records themselves.
	if err := json.NewDecoder(io.LimitReader(f, 2*savedOutputBudget+(8<<20))).Decode(&all); err != nil {
		return nil, fmt.Errorf("saved execs: %w", err)
	}
	out := all[:0]
	for _, sv := range all {
		if guest.ValidExecID(sv.ID) && len(sv.Argv) > 0 && len(out) < maxRunningSessions+maxFinishedSessions {
			out = append(out, sv)
		}
	}
	return out, nil
}

// restore brings back the execs a pause saved: finished ones as they
// were, parked ones adopted from the agent under their ids. With inherit
// (a sandbox cloned from a snapshot, a fork: saved is the snapshot's),
// each adoption is recorded, and the agent's other parked execs are
// adopted too, as tenant's, from what the guest reports. An exec that
// cannot be adopted ends with a note saying why.
func (t *sessions) restore(ctx context.Context, saved []savedExec, inherit bool, tenant string) {
	known := map[string]bool{}
	for _, sv := range slices.Backward(saved) { // oldest first, as they ran
		known[sv.ID] = true
		if sv.Exit != nil {
			t.addFinished(sv)
			continue
		}
		t.adopt(ctx, sv, inherit)
	}
	if !inherit || !t.CanPark() {
		return
	}
	parked, err := t.agent.ListParked(ctx)
	if err != nil {
		t.log.Warn("list parked execs", "err", err)
		return
	}
	for _, p := range parked {
		if known[p.GetToken()] || !guest.ValidExecID(p.GetToken()) {
			continue
		}
		argv := make([]string, 0, min(len(p.GetArgv()), maxSavedArgs))
		for _, a := range p.GetArgv()[:min(len(p.GetArgv()), maxSavedArgs)] {
			argv = append(argv, guest.Text(a, maxSavedArg))
		}
		if len(argv) == 0 {
			argv = []string{"?"}
		}
		sv := savedExec{ID: p.GetToken(), Argv: argv, PID: p.GetPid(), Stdin: p.GetStdin(), TTY: p.GetTty(), Tenant: tenant,
			StartedAt: t.clk.Now(), Limit: DefaultMaxOutputBytes}
		if ms := p.GetTimeoutLeftMs(); ms > 0 {
			sv.DeadlineLeft = int64(time.Duration(ms)*time.Millisecond + t.grace)
		}
		t.adopt(ctx, sv, true)
	}
}

// addFinished adds a finished exec as a pause saved it.
func (t *sessions) addFinished(sv savedExec) {
	s := t.savedSession(sv)
	x := sv.Exit
	s.exit = &agentv1.ExecExited{ExitCode: x.Code, Signal: x.Signal, TimedOut: x.TimedOut, OutputTruncated: x.Truncated, DurationMs: x.DurationMs, OomKilled: x.OOMKilled}
	s.endedAt = sv.EndedAt
	close(s.pumpDone)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byID[s.id] = s
	t.finished = append(t.finished, s.id)
}

// savedSession is the session sv describes, with its output, and no
// stream.
func (t *sessions) savedSession(sv savedExec) *session {
	s := &session{id: sv.ID, argv: sv.Argv, pid: sv.PID, stdin: sv.Stdin, tty: sv.TTY, tenant: sv.Tenant, keyID: sv.KeyID,
		startedAt: sv.StartedAt, dropped: sv.Dropped, attachers: map[*attacher]struct{}{}, pumpDone: make(chan struct{})}
	for _, c := range sv.Output {
		if s.outBytes+len(c.Data) > t.retainCap {
			s.dropped += uint64(len(c.Data))
			continue
		}
		ev := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: c.Data}}
		if c.Stderr {
			ev = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: c.Data}}
		}
		s.out = append(s.out, ev)
		s.outBytes += len(c.Data)
	}
	return s
}

// adopt takes over the exec the agent parked under sv.ID. inherited: it
// was parked in another sandbox (a fork's source), and is recorded as
// adopted.
func (t *sessions) adopt(ctx context.Context, sv savedExec, inherited bool) {
	s := t.savedSession(sv)
	limit := sv.Limit
	if limit == 0 || limit > DefaultMaxOutputBytes {
		limit = DefaultMaxOutputBytes
	}
	g, err := openAdopt(t.ctx(), t.agent, sv.ID, t.clk, limit, min(sv.Sent, limit), sv.Truncated, time.Duration(max(sv.DeadlineLeft, 0)))
	var ev *agentv1.ExecResponse
	if err == nil {
		stop := context.AfterFunc(ctx, g.cancel)
		ev, err = g.Next()
		stop()
		if err == nil && ev.GetStarted() == nil && ev.GetExited() == nil {
			err = errors.New("the guest did not report the adopted exec's start")
		}
		if err != nil {
			g.Close()
		}
	}
	if err != nil {
		t.log.Warn("adopt parked exec", "exec_id", sv.ID, "err", err)
		why := "the process was lost across the pause"
		if connect.CodeOf(err) == connect.CodeNotFound {
			why = "the guest no longer had the process after the resume"
		}
		s.out = append(s.out, &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: []byte("[airlock: " + why + "]\n")}})
		t.mu.Lock()
		t.running++ // finish releases it
		t.byID[s.id] = s
		t.mu.Unlock()
		close(s.pumpDone)
		t.finish(s, &agentv1.ExecExited{ExitCode: -1, Signal: 9})
		return
	}
	s.g = g
	if inherited {
		_ = t.audit(s, "exec.adopt", map[string]any{"exec_id": s.id, "argv": s.argv, "reason": "parked in the snapshot this sandbox was cloned from"})
	}
	t.mu.Lock()
	t.running++
	t.byID[s.id] = s
	ok := t.goLocked(func() {
		if ev.GetExited() != nil { // it ended while parked
			defer close(s.pumpDone)
			defer g.Close()
			t.finish(s, ev.GetExited())
			return
		}
		t.pump(s)
	})
	t.mu.Unlock()
	if !ok {
		g.Close()
	}
	t.log.Debug("exec session adopted", "exec_id", s.id, "pid", ev.GetStarted().GetPid())
}
