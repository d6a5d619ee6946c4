package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor/monitor"
)

// Process audit (Spec.ProcAudit): runsc's Runtime Monitoring. The
// instance makes the sink's socket in a 0700 directory of its run dir
// and names it in a trace session (--pod-init-config); `runsc run`
// connects to it before it creates the sandbox and hands the connection
// to the Sentry, which then writes every exec and exit of the guest to it
// (package monitor). The guest has no way to the socket: it is a host
// path outside every mount of the sandbox, and the Sentry's end is a host
// fd the guest cannot name.
const (
	monitorDir    = "monitor"
	monitorConfig = "init.json"
	monitorSocket = "sink.sock"
	// monitorAcceptTimeout bounds the wait for runsc's connection.
	monitorAcceptTimeout = 2 * time.Minute
	// monitorStartTimeout bounds the wait for the session's first point
	// once the sandbox runs (it was sent before the agent started).
	monitorStartTimeout = 5 * time.Second
)

var _ runtime.ProcWatcher = (*instance)(nil)

// procMonitor is the instance's end of the trace session.
type procMonitor struct {
	// err is why there is no session (set before runsc starts), or why
	// the accept failed (set before done closes).
	err    error
	ln     *monitor.Listener
	cancel context.CancelFunc
	// done is closed when the accept has ended; conn is set then unless
	// err is.
	done  chan struct{}
	conn  *monitor.Conn
	taken bool // by ProcEvents
	// accepting is set once the accept runs (the goroutine that runs
	// runsc sets it before it waits for runsc); closed once closeMonitor
	// has run.
	accepting, closed bool
}

// prepareMonitor makes the session's files before runsc starts. A
// failure leaves the sandbox without process audit (ProcEvents says
// why), not without a start.
func (in *instance) prepareMonitor() {
	m := &procMonitor{done: make(chan struct{})}
	in.mu.Lock()
	in.mon = m
	in.mu.Unlock()
	dir := filepath.Join(in.spec.RunDir, monitorDir)
	sock := filepath.Join(dir, monitorSocket)
	js, err := monitor.InitConfig(sock)
	if err == nil {
		// (A previous run's, if its cleanup did not finish: no mounts.)
		_ = os.RemoveAll(dir)
		err = os.Mkdir(dir, 0o700)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, monitorConfig), js, 0o600)
	}
	if err == nil {
		m.ln, err = monitor.Listen(sock)
	}
	if err != nil {
		m.err = fmt.Errorf("gvisor process monitor: %w", err)
		close(m.done)
		in.log.Warn("no process audit", "err", err)
		return
	}
	in.paths.monitor = dir
}

// acceptMonitor waits, in the background, for runsc (pid) to connect.
// It is called once runsc has started, before anything waits for it.
func (in *instance) acceptMonitor(runscPID int) {
	m := in.mon
	if m == nil || m.ln == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), monitorAcceptTimeout)
	in.mu.Lock()
	m.cancel, m.accepting = cancel, true
	in.mu.Unlock()
	go func() {
		defer close(m.done)
		defer cancel()
		c, err := m.ln.Accept(ctx, func(pid int) bool { return pid == runscPID || parentPID(pid) == runscPID })
		in.mu.Lock()
		m.conn, m.err = c, err
		in.mu.Unlock()
	}()
}

// closeMonitor ends the accept and closes what ProcEvents did not take.
// It runs once runsc has exited (or failed to start). Idempotent.
func (in *instance) closeMonitor() {
	m := in.mon
	if m == nil {
		return
	}
	in.mu.Lock()
	if m.closed {
		in.mu.Unlock()
		return
	}
	m.closed = true
	accepting := m.accepting
	in.mu.Unlock()
	if m.ln != nil {
		_ = m.ln.Close()
	}
	if accepting {
		m.cancel()
		<-m.done
	} else if m.err == nil {
		m.err = errors.New("gvisor: runsc did not start")
		close(m.done)
	}
	in.mu.Lock()
	c := m.conn
	if m.taken {
		c = nil
	}
	m.conn = nil
	in.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// ProcEvents returns the Sentry's stream of the guest's execs and exits
// (runtime.ProcWatcher). It fails when the instance was not asked to
// report them (Spec.ProcAudit) or the session did not start.
func (in *instance) ProcEvents(ctx context.Context) (runtime.ProcStream, error) {
	in.mu.Lock()
	m := in.mon
	switch {
	case in.state != stateRunning:
		in.mu.Unlock()
		return nil, runtime.ErrNotRunning
	case m == nil:
		in.mu.Unlock()
		return nil, errors.New("gvisor: the instance was created without process audit")
	case m.taken:
		in.mu.Unlock()
		return nil, errors.New("gvisor: process events already taken")
	}
	m.taken = true
	in.mu.Unlock()
	select {
	case <-m.done:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	in.mu.Lock()
	c, err := m.conn, m.err
	in.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, runtime.ErrNotRunning
	}
	if in.spec.RestoreFrom != "" {
		// A restored sandbox's init started long ago: no container/start
		// comes, and the session is live once runsc has connected.
		return c, nil
	}
	deadline := time.Now().Add(monitorStartTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.WaitStarted(deadline); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// parentPID returns pid's parent's pid, or 0.
func parentPID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
