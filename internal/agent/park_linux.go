package agent

import (
	"errors"
	"slices"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// Limits on parked execs (see ExecService.Exec in the proto).
const (
	// maxParked caps the parked execs at a time.
	maxParked = agentapi.MaxParked
	// maxParkToken caps a park token's length.
	maxParkToken = 128
	// defaultParkExpiry is how long a parked exec waits to be adopted, in
	// guest running time (a frozen guest's monotonic clock stands still).
	defaultParkExpiry = 5 * time.Minute
)

// execState is a running exec apart from any stream: the process and what
// is left of its output cap and timeout. A stream owns it while it runs the
// exec; the park table owns it while it is parked.
type execState struct {
	spec *execSpec
	p    *process

	// Set by the stream that owns it, read when it is parked.
	left        uint64        // output bytes still allowed
	truncated   bool          // output was dropped at the cap
	timeoutLeft time.Duration // 0: no timeout
	timedOut    bool          // the timeout fired (the kill may be under way)

	expiry *time.Timer // while parked
}

// parkTable holds the parked execs by token. Safe for concurrent use.
type parkTable struct {
	expiry time.Duration
	// wg owns the goroutines that reap expired execs.
	wg *sync.WaitGroup

	mu     sync.Mutex
	execs  map[string]*execState
	closed bool
}

func newParkTable(expiry time.Duration, wg *sync.WaitGroup) *parkTable {
	if expiry <= 0 {
		expiry = defaultParkExpiry
	}
	return &parkTable{expiry: expiry, wg: wg, execs: map[string]*execState{}}
}

// checkToken validates a park token.
func checkToken(token string) error {
	if token == "" || len(token) > maxParkToken {
		return invalidf("park token must be 1..%d bytes", maxParkToken)
	}
	return nil
}

// add parks e under token and arms its expiry. On error the caller still
// owns e.
func (t *parkTable) add(token string, e *execState) error {
	if err := checkToken(token); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return connect.NewError(connect.CodeUnavailable, errors.New("the agent is shutting down"))
	case t.execs[token] != nil:
		return connect.NewError(connect.CodeAlreadyExists, errors.New("an exec is already parked with this token"))
	case len(t.execs) >= maxParked:
		return connect.NewError(connect.CodeResourceExhausted, errors.New("too many parked execs"))
	}
	t.execs[token] = e
	e.expiry = time.AfterFunc(t.expiry, func() { t.expire(token, e) })
	return nil
}

// take removes the exec parked under token for an adopter; nil if none.
func (t *parkTable) take(token string) *execState {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.execs[token]
	if e != nil {
		delete(t.execs, token)
		e.expiry.Stop()
	}
	return e
}

// expire kills e if it is still parked under token.
func (t *parkTable) expire(token string, e *execState) {
	t.mu.Lock()
	if t.execs[token] != e {
		t.mu.Unlock()
		return
	}
	delete(t.execs, token)
	// Under the lock, so close (which waits for wg) cannot miss it.
	t.wg.Go(func() { e.discard() })
	t.mu.Unlock()
}

// close kills every parked exec and refuses new ones. The caller waits
// for wg.
func (t *parkTable) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for token, e := range t.execs {
		delete(t.execs, token)
		e.expiry.Stop()
		t.wg.Go(func() { e.discard() })
	}
}

// list describes the parked execs, ordered by token.
func (t *parkTable) list() []*agentv1.ParkedExec {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*agentv1.ParkedExec, 0, len(t.execs))
	for token, e := range t.execs {
		out = append(out, &agentv1.ParkedExec{
			Token:         token,
			Pid:           int32(e.p.pid),
			Argv:          e.spec.argv,
			Tty:           e.spec.tty != nil,
			Stdin:         e.spec.stdin,
			StartUnixMs:   e.p.start.UnixMilli(),
			TimeoutLeftMs: uint32(min(e.timeoutLeft.Milliseconds(), int64(^uint32(0)))),
			// Signal 0 fails once the process has been reaped.
			Exited: e.p.reaper.Signal(e.p.pid, syscall.Signal(0), false) != nil,
		})
	}
	slices.SortFunc(out, func(a, b *agentv1.ParkedExec) int {
		switch {
		case a.GetToken() < b.GetToken():
			return -1
		case a.GetToken() > b.GetToken():
			return 1
		}
		return 0
	})
	return out
}

// discard kills an exec nobody will adopt, waits for its process and
// frees what the agent holds for it.
func (e *execState) discard() {
	e.p.kill()
	<-e.p.done
	e.p.release()
}
