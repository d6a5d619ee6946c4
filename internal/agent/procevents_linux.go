package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// Process audit (AgentService.ProcEvents): the guest kernel's
// process-events connector (NETLINK_CONNECTOR, CN_IDX_PROC) multicasts
// every exec and exit; for an exec the agent reads the program, argv,
// working directory and ids from /proc/PID before sending it on. Reading
// /proc races the process: one that exits (or execs again) first is
// reported gone (or with its next program). The kernel reports events in
// the initial pid namespace, where the agent runs as PID 1.
//
// Bounds: argv at most procMaxArgs arguments and procMaxArgvBytes bytes in
// all, paths procMaxPath bytes; at most procQueue events wait to be sent
// (more are counted as lost), procBatch per message; exits are reported
// only for processes whose exec was (at most procMaxTracked at once).

// Linux connector ABI (include/uapi/linux/connector.h, cn_proc.h).
const (
	cnIdxProc          = 0x1
	cnValProc          = 0x1
	procCnMcastListen  = 1
	procCnMcastIgnore  = 2
	procEventExec      = 0x00000002
	procEventExit      = 0x80000000
	nlmsgHdrLen        = 16
	cnMsgLen           = 20 // struct cb_id (8) + seq, ack (8) + len, flags (4)
	procEventHdrLen    = 16 // what, cpu, timestamp_ns
	procEventExecLen   = 8  // process_pid, process_tgid
	procEventExitLen   = 24 // + exit_code, exit_signal, parent_pid, parent_tgid
	procMaxArgs        = 32
	procMaxArgvBytes   = 1024
	procMaxPath        = 512
	procQueue          = 4096
	procBatch          = 256
	procMaxTracked     = 8192
	procMaxStreams     = 2
	procFlushInterval  = 50 * time.Millisecond
	procRecvBufBytes   = 4 << 20
	procCmdlineMaxRead = 4096
)

// procSocket is a subscription to the process-events connector. Its
// reader waits in poll(2) on the socket and on an eventfd (stopRead), with
// no timeout, so an idle guest costs no wakeups: a read with a receive
// timeout woke the agent, and the Go runtime's sysmon after it, every
// timeout, and under TCG each wakeup is a guest timer interrupt that
// QEMU's main loop serves. The wait stays a blocking system call on a
// thread of its own: read through Go's poller instead, the reader lagged
// behind a tight exec loop and lost its last events when the stream ended.
type procSocket struct {
	fd   int
	wake int // eventfd: stopRead
}

// errProcStopped is recv's error after stopRead.
var errProcStopped = errors.New("process-events reader stopped")

// openProcSocket joins the connector's process-events group and asks the
// kernel to report. ErrUnsupported-wrapped errors mean the kernel has no
// connector (gVisor, a kernel without CONFIG_PROC_EVENTS).
func openProcSocket() (*procSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("%w: process-events connector: %w", errors.ErrUnsupported, err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("process-events connector: %w", err)
	}
	s := &procSocket{fd: fd, wake: wake}
	ok := false
	defer func() {
		if !ok {
			_ = unix.Close(fd)
			_ = unix.Close(wake)
		}
	}()
	// A large receive buffer rides out bursts (a shell loop of short
	// programs) while the agent reads /proc; as root it may pass rmem_max.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, procRecvBufBytes); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, procRecvBufBytes)
	}
	// Only exec and process exit events wake the agent: the kernel drops
	// forks, thread exits, uid changes and the rest before they are
	// queued (each would cost a wakeup per fork under TCG).
	filter := procFilter()
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}); err != nil {
		return nil, fmt.Errorf("process-events connector: filter: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		return nil, fmt.Errorf("%w: process-events connector: bind: %w", errors.ErrUnsupported, err)
	}
	if err := s.control(procCnMcastListen); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// procFilter is a classic BPF program that keeps exec events and the exit
// events of processes (not threads: process_pid == process_tgid). Loads
// are big-endian; the event's fields are in host order.
func procFilter() []unix.SockFilter {
	be := func(v uint32) uint32 { return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, v)) }
	const (
		what = nlmsgHdrLen + cnMsgLen // proc_event.what
		pid  = what + procEventHdrLen // event_data.*.process_pid
		tgid = pid + 4
	)
	return []unix.SockFilter{
		/* 0 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: what},
		/* 1 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: be(procEventExec), Jt: 5}, // -> 7
		/* 2 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: be(procEventExit), Jf: 5}, // -> 8
		/* 3 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: pid},
		/* 4 */ {Code: unix.BPF_MISC | unix.BPF_TAX},
		/* 5 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: tgid},
		/* 6 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_X, Jf: 1}, // -> 8
		/* 7 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		/* 8 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// control sends a PROC_CN_MCAST_* request to the kernel.
func (s *procSocket) control(op uint32) error {
	var port uint32
	if sa, err := unix.Getsockname(s.fd); err == nil {
		if nl, isNL := sa.(*unix.SockaddrNetlink); isNL {
			port = nl.Pid
		}
	}
	b := make([]byte, nlmsgHdrLen+cnMsgLen+4)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.NLMSG_DONE)
	ne.PutUint32(b[12:], port)
	c := b[nlmsgHdrLen:]
	ne.PutUint32(c[0:], cnIdxProc)
	ne.PutUint32(c[4:], cnValProc)
	ne.PutUint16(c[16:], 4)
	ne.PutUint32(c[cnMsgLen:], op)
	if err := unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("%w: process-events connector: subscribe: %w", errors.ErrUnsupported, err)
	}
	return nil
}

func (s *procSocket) close() {
	_ = s.control(procCnMcastIgnore)
	_ = unix.Close(s.fd)
	_ = unix.Close(s.wake)
}

// recv reads one datagram, waiting for one as long as it takes; it fails
// with errProcStopped once stopRead has been called.
func (s *procSocket) recv(buf []byte) (int, error) {
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.wake), Events: unix.POLLIN}}
	for {
		n, _, err := unix.Recvfrom(s.fd, buf, unix.MSG_DONTWAIT)
		if !errors.Is(err, unix.EAGAIN) {
			return n, err
		}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, err
		}
		if fds[1].Revents != 0 {
			return 0, errProcStopped
		}
	}
}

// stopRead makes a pending and every later recv return at once.
func (s *procSocket) stopRead() {
	_, _ = unix.Write(s.wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
}

// rawProcEvent is one connector event, before /proc is read.
type rawProcEvent struct {
	what       uint32
	tsNano     uint64 // CLOCK_MONOTONIC
	pid, tgid  int32
	exitStatus uint32 // wait status (exit code << 8 | signal)
}

// parseProcEvents calls fn for each exec and exit event in one datagram
// (possibly several netlink messages). Anything short or foreign is
// skipped.
func parseProcEvents(b []byte, fn func(rawProcEvent)) {
	ne := binary.NativeEndian
	for len(b) >= nlmsgHdrLen {
		n := int(ne.Uint32(b[0:]))
		if n < nlmsgHdrLen || n > len(b) {
			return
		}
		msg := b[nlmsgHdrLen:n]
		b = b[min(len(b), (n+3)&^3):]
		if len(msg) < cnMsgLen+procEventHdrLen || ne.Uint32(msg[0:]) != cnIdxProc || ne.Uint32(msg[4:]) != cnValProc {
			continue
		}
		data := msg[cnMsgLen:]
		if dl := int(ne.Uint16(msg[16:])); dl < len(data) {
			data = data[:dl]
		}
		if len(data) < procEventHdrLen {
			continue
		}
		ev := rawProcEvent{what: ne.Uint32(data[0:]), tsNano: ne.Uint64(data[8:])}
		body := data[procEventHdrLen:]
		switch ev.what {
		case procEventExec:
			if len(body) < procEventExecLen {
				continue
			}
		case procEventExit:
			if len(body) < procEventExitLen-8 {
				continue
			}
			ev.exitStatus = ne.Uint32(body[8:])
		default:
			continue
		}
		ev.pid = int32(ne.Uint32(body[0:]))
		ev.tgid = int32(ne.Uint32(body[4:]))
		fn(ev)
	}
}

// readProcFile reads up to len(buf) bytes of a /proc file with plain
// system calls (open, read, close: os.ReadFile adds an fstat and a
// netpoller registration, which cost under TCG on every exec).
func readProcFile(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return buf[:n], nil
}

// procInfo reads what /proc says about an exec'ing process. gone reports
// that it had exited (or its /proc could not be read) first. buf is
// scratch space (at least procCmdlineMaxRead bytes), reused across calls.
func procInfo(pid int32, buf []byte) *agentv1.ProcEvent {
	e := &agentv1.ProcEvent{Kind: agentv1.ProcEvent_KIND_EXEC, Pid: uint32(pid)}
	dir := "/proc/" + strconv.Itoa(int(pid))
	status, err := readProcFile(dir+"/status", buf)
	if err != nil {
		e.Gone = true
		return e
	}
	for line := range strings.Lines(string(status)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		switch {
		case k == "PPid" && len(f) > 0:
			if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				e.Ppid = uint32(n)
			}
		case k == "Uid" && len(f) > 1:
			if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				e.Uid = uint32(n)
			}
			if n, err := strconv.ParseUint(f[1], 10, 32); err == nil {
				e.Euid = uint32(n)
			}
		}
	}
	exe, err := os.Readlink(dir + "/exe")
	if err != nil {
		e.Gone = true
		return e
	}
	e.Path = procText(exe, procMaxPath)
	if cmdline, err := readProcFile(dir+"/cmdline", buf[:procCmdlineMaxRead]); err == nil {
		e.Argv, e.ArgvTruncated = splitCmdline(cmdline, len(cmdline) == procCmdlineMaxRead)
	}
	if cwd, err := os.Readlink(dir + "/cwd"); err == nil {
		e.Cwd = procText(cwd, procMaxPath)
	}
	return e
}

// splitCmdline splits NUL-separated arguments within the bounds.
func splitCmdline(b []byte, truncated bool) ([]string, bool) {
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, truncated
	}
	var argv []string
	total := 0
	for arg := range bytes.SplitSeq(b, []byte{0}) {
		if len(argv) == procMaxArgs || total == procMaxArgvBytes {
			return argv, true
		}
		a := procText(string(arg), procMaxArgvBytes-total)
		total += len(a)
		argv = append(argv, a)
		if a != string(arg) && total == procMaxArgvBytes {
			truncated = true
		}
	}
	return argv, truncated
}

// procText makes s valid UTF-8 (a proto string must be) and at most max
// bytes, cut on a rune boundary.
func procText(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// procStream is one ProcEvents stream's state: the queue between the
// socket reader and the sender, and the processes whose exit is wanted.
type procStream struct {
	mu      sync.Mutex
	queue   []*agentv1.ProcEvent
	lost    uint64
	tracked map[int32]string // pid -> path of its reported exec
	buf     []byte           // procInfo's scratch space (the reader's only)
	wake    chan struct{}
	self    int32
	// wallOffset turns the kernel's CLOCK_MONOTONIC event time into wall
	// time.
	wallOffset int64
}

func newProcStream() *procStream {
	p := &procStream{tracked: map[int32]string{}, wake: make(chan struct{}, 1), self: int32(os.Getpid()), buf: make([]byte, 8<<10)}
	var mono unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono) == nil {
		p.wallOffset = time.Now().UnixNano() - mono.Nano()
	}
	return p
}

// push queues e, or counts it lost when the queue is full.
func (p *procStream) push(e *agentv1.ProcEvent) {
	p.mu.Lock()
	if len(p.queue) >= procQueue {
		p.lost++
	} else {
		p.queue = append(p.queue, e)
	}
	p.mu.Unlock()
	p.signal()
}

// signal wakes the sender (it batches for procFlushInterval first).
func (p *procStream) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take returns up to procBatch queued events and the lost count, and
// resets the latter.
func (p *procStream) take() ([]*agentv1.ProcEvent, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := min(len(p.queue), procBatch)
	out := make([]*agentv1.ProcEvent, n)
	copy(out, p.queue[:n])
	p.queue = append(p.queue[:0], p.queue[n:]...)
	lost := p.lost
	p.lost = 0
	return out, lost
}

// handle turns one connector event into a queued ProcEvent.
func (p *procStream) handle(ev rawProcEvent) {
	if ev.tgid == p.self || ev.tgid <= 0 {
		return
	}
	at := int64(ev.tsNano) + p.wallOffset
	switch ev.what {
	case procEventExec:
		e := procInfo(ev.tgid, p.buf)
		e.UnixNano = at
		e.Agent = !e.Gone && int32(e.Ppid) == p.self
		p.mu.Lock()
		if _, ok := p.tracked[ev.tgid]; ok || len(p.tracked) < procMaxTracked {
			p.tracked[ev.tgid] = e.Path
		}
		p.mu.Unlock()
		p.push(e)
	case procEventExit:
		if ev.pid != ev.tgid {
			return // a thread, not the process
		}
		p.mu.Lock()
		path, ok := p.tracked[ev.tgid]
		delete(p.tracked, ev.tgid)
		p.mu.Unlock()
		if !ok {
			return
		}
		e := &agentv1.ProcEvent{Kind: agentv1.ProcEvent_KIND_EXIT, UnixNano: at, Pid: uint32(ev.tgid), Path: path}
		if sig := ev.exitStatus & 0x7f; sig != 0 {
			e.Signal = int32(sig)
		} else {
			e.ExitCode = int32(ev.exitStatus>>8) & 0xff
		}
		p.push(e)
	}
}

// read receives connector datagrams until s.stopRead.
func (p *procStream) read(s *procSocket) {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.recv(buf)
		switch {
		case errors.Is(err, unix.ENOBUFS):
			// The kernel dropped events it could not queue: how many is
			// unknown, at least one.
			p.mu.Lock()
			p.lost++
			p.mu.Unlock()
			p.signal()
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return
		}
		parseProcEvents(buf[:n], p.handle)
	}
}

// ProcEvents streams the guest's execs and exits while the stream is open.
func (a *agentService) ProcEvents(ctx context.Context, _ *connect.Request[agentv1.ProcEventsRequest], stream *connect.ServerStream[agentv1.ProcEventsResponse]) error {
	if a.procStreams.Add(1) > procMaxStreams {
		a.procStreams.Add(-1)
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d process-event streams", procMaxStreams))
	}
	defer a.procStreams.Add(-1)
	sock, err := openProcSocket()
	if err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return connect.NewError(connect.CodeUnimplemented, err)
		}
		return connect.NewError(connect.CodeInternal, err)
	}
	p := newProcStream()
	var wg sync.WaitGroup
	wg.Go(func() { p.read(sock) })
	defer func() {
		sock.stopRead()
		wg.Wait()
		sock.close()
	}()
	// The first message tells the host the stream is live.
	if err := stream.Send(&agentv1.ProcEventsResponse{}); err != nil {
		return err
	}
	// An idle guest costs no wakeups: the sender sleeps until an event
	// comes, then lets a batch gather for procFlushInterval.
	batch := time.NewTimer(procFlushInterval)
	batch.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		}
		batch.Reset(procFlushInterval)
		select {
		case <-ctx.Done():
			return nil
		case <-batch.C:
		}
		for {
			events, lost := p.take()
			if len(events) == 0 && lost == 0 {
				break
			}
			if err := stream.Send(&agentv1.ProcEventsResponse{Events: events, Lost: lost}); err != nil {
				return err
			}
			if len(events) < procBatch {
				break
			}
		}
	}
}
