package fake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// file is one entry of the fake guest's filesystem.
type file struct {
	dir   bool
	data  []byte
	mode  uint32
	mtime time.Time
}

// fs is the fake guest's filesystem: absolute clean paths to entries.
type fs struct {
	mu    sync.Mutex
	files map[string]*file
}

func newFS() *fs {
	now := time.Now()
	return &fs{files: map[string]*file{
		"/": {dir: true, mode: 0o755, mtime: now}, "/root": {dir: true, mode: 0o700, mtime: now},
		"/tmp": {dir: true, mode: 0o1777, mtime: now},
	}}
}

// clone deep-copies the filesystem (a snapshot).
func (f *fs) clone() *fs {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &fs{files: make(map[string]*file, len(f.files))}
	for p, e := range f.files {
		cp := *e
		cp.data = bytes.Clone(e.data)
		c.files[p] = &cp
	}
	return c
}

// agent is the fake guest agent: AgentService, ExecService and FileService
// over an in-memory filesystem, with a tiny command set for Exec.
type agent struct {
	fs       *fs
	cpus     int
	memBytes uint64
	booted   time.Time
	// powerOff is called (once, after the reply) by Shutdown.
	powerOff func()

	// ctxs is the ContextService (contexts.go).
	ctxs codeContexts

	mu      sync.Mutex
	nextPID int32
}

// --- AgentService ---

func (a *agent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{
		ProtocolVersion: protocolVersion,
		AgentVersion:    "fake",
		KernelRelease:   "fake",
		UptimeSeconds:   time.Since(a.booted).Seconds(),
		MemTotalBytes:   a.memBytes,
		Cpus:            uint32(a.cpus),
	}), nil
}

func (a *agent) Usage(context.Context, *connect.Request[agentv1.UsageRequest]) (*connect.Response[agentv1.UsageResponse], error) {
	a.fs.mu.Lock()
	var used uint64
	for _, f := range a.fs.files {
		used += uint64(len(f.data))
	}
	a.fs.mu.Unlock()
	up := uint64(time.Since(a.booted))
	return connect.NewResponse(&agentv1.UsageResponse{
		CpuBusyNs: up / 100, CpuTotalNs: up * uint64(a.cpus), Cpus: uint32(a.cpus),
		MemTotalBytes: a.memBytes, MemAvailableBytes: a.memBytes / 2, MemCachedBytes: a.memBytes / 8,
		DiskTotalBytes: 2 << 30, DiskUsedBytes: used,
	}), nil
}

func (a *agent) Sync(_ context.Context, req *connect.Request[agentv1.SyncRequest]) (*connect.Response[agentv1.SyncResponse], error) {
	if n := len(req.Msg.GetEntropy()); n < 32 || n > 512 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("entropy must be 32..512 bytes"))
	}
	return connect.NewResponse(&agentv1.SyncResponse{
		GuestUnixNanoBefore: time.Now().UnixNano(),
		RootSizeBytes:       1 << 30,
	}), nil
}

func (a *agent) Shutdown(context.Context, *connect.Request[agentv1.ShutdownRequest]) (*connect.Response[agentv1.ShutdownResponse], error) {
	// Reply first, then power off, like the real agent.
	time.AfterFunc(100*time.Millisecond, a.powerOff) // the real agent waits as long
	return connect.NewResponse(&agentv1.ShutdownResponse{}), nil
}

// ProcEvents is not implemented: the fake reports a protocol without it
// (agentapi.VersionProcAudit).
func (a *agent) ProcEvents(context.Context, *connect.Request[agentv1.ProcEventsRequest], *connect.ServerStream[agentv1.ProcEventsResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("the fake agent has no process audit"))
}

// --- ExecService ---

// protocolVersion is the agent protocol the fake speaks: all but parking
// (agentapi.VersionPark), which it does not implement.
const protocolVersion = agentapi.VersionPark - 1

// ListParked is not implemented: the fake reports a protocol without it.
func (a *agent) ListParked(context.Context, *connect.Request[agentv1.ListParkedRequest]) (*connect.Response[agentv1.ListParkedResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("the fake agent does not park execs"))
}

// fakeCommands are the programs the fake guest has.
var fakeCommands = map[string]bool{"true": true, "false": true, "echo": true, "exit": true, "cat": true, "sleep": true, "sh": true, "printf": true, "env": true}

// Exec runs one of: true, false, env (its environment), echo ARGS, exit N, cat (stdin to stdout),
// cat FILE... (files of its filesystem to stdout), sleep SECONDS, printf
// FORMAT [ARGS] (%s, %%, \n, \t and \\ only), and sh -c SCRIPT: commands
// separated by ';', words split on blanks or quoted in single quotes, each
// of the above or `kill -N $$` (the shell kills itself with signal N), and
// `>&2` at the end of one sends its stdout to stderr. Like the real
// agent it refuses to start another program (NotFound, or PermissionDenied
// for a file of its filesystem), a cwd that is not one of its directories
// and a user other than root or nobody; in sh -c any other command exits
// 127 with "command not found" on stderr.
func (a *agent) Exec(ctx context.Context, st *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse]) error {
	first, err := st.Receive()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil || len(start.GetArgv()) == 0 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("first request must be start with an argv"))
	}
	if err := a.startable(start); err != nil {
		return err
	}
	a.mu.Lock()
	a.nextPID++
	pid := 100 + a.nextPID
	a.mu.Unlock()
	if err := st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: &agentv1.ExecStarted{Pid: pid}}}); err != nil {
		return err
	}
	t0 := time.Now()

	// Requests after start: stdin, close_stdin, signal.
	stdin := make(chan []byte, 16)
	signals := make(chan int32, 4)
	procCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		stdinOpen := true
		defer func() {
			if stdinOpen {
				close(stdin)
			}
		}()
		for {
			req, err := st.Receive()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					cancel() // the client went away: kill
				}
				return
			}
			switch m := req.GetMsg().(type) {
			case *agentv1.ExecRequest_Stdin:
				if !stdinOpen {
					continue
				}
				select {
				case stdin <- m.Stdin:
				case <-procCtx.Done():
					return
				}
			case *agentv1.ExecRequest_CloseStdin:
				if stdinOpen {
					close(stdin)
					stdinOpen = false
				}
			case *agentv1.ExecRequest_Signal:
				select {
				case signals <- m.Signal:
				default:
				}
			}
		}
	}()

	runCtx := procCtx
	if ms := start.GetTimeoutMs(); ms > 0 {
		var c context.CancelFunc
		runCtx, c = context.WithTimeoutCause(procCtx, time.Duration(ms)*time.Millisecond, errTimedOut)
		defer c()
	}
	out := func(b []byte) error {
		return st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: b}})
	}
	exited := &agentv1.ExecExited{}
	var code, sig int32
	if start.GetArgv()[0] == "env" {
		// The environment the exec got, one NAME=value a line.
		err = out([]byte(strings.Join(append(slices.Clone(start.GetEnv()), ""), "\n")))
	} else {
		code, sig, err = a.runCommand(runCtx, start.GetArgv(), start.GetStdin(), stdin, signals, out, func(b []byte) error {
			return st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: b}})
		})
	}
	if err != nil {
		return err
	}
	exited.ExitCode, exited.Signal = code, sig
	exited.TimedOut = errors.Is(context.Cause(runCtx), errTimedOut)
	exited.DurationMs = time.Since(t0).Milliseconds()
	// Returning ends the stream, which also ends the receiver's Receive;
	// it cannot be awaited here, as the client need not half-close.
	return st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: exited}})
}

var errTimedOut = errors.New("exec timed out")

// startable refuses what the real agent cannot start, with its codes.
func (a *agent) startable(start *agentv1.ExecStart) error {
	switch start.GetUser() {
	case "", "root", "0", "nobody", "65534":
	default:
		return connect.NewError(connect.CodeNotFound, errors.New("unknown user"))
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if cwd := start.GetCwd(); cwd != "" {
		if e, ok := a.fs.files[path.Clean(cwd)]; !ok || !e.dir {
			return connect.NewError(connect.CodeNotFound, errors.New("cwd: no such file or directory"))
		}
	}
	if prog := start.GetArgv()[0]; !fakeCommands[path.Base(prog)] {
		if _, ok := a.fs.files[path.Clean(prog)]; ok {
			return connect.NewError(connect.CodePermissionDenied, errors.New("start: permission denied"))
		}
		return connect.NewError(connect.CodeNotFound, errors.New("executable not found in PATH"))
	}
	return nil
}

// runCommand interprets argv; stdinOpen says whether the exec has a
// stdin. It returns the exit code and signal.
func (a *agent) runCommand(ctx context.Context, argv []string, stdinOpen bool, stdin <-chan []byte, signals <-chan int32, stdout, stderr func([]byte) error) (int32, int32, error) {
	if len(argv) == 3 && argv[0] == "sh" && argv[1] == "-c" {
		return a.runScript(ctx, argv[2], stdinOpen, stdin, signals, stdout, stderr)
	}
	switch argv[0] {
	case "true":
		return 0, 0, nil
	case "false":
		return 1, 0, nil
	case "echo":
		return 0, 0, stdout([]byte(strings.Join(argv[1:], " ") + "\n"))
	case "exit":
		n := 0
		if len(argv) > 1 {
			n, _ = strconv.Atoi(argv[1])
		}
		return int32(n & 0xff), 0, nil
	case "cat":
		if len(argv) > 1 {
			return a.catFiles(argv[1:], stdout, stderr)
		}
		if !stdinOpen {
			return 0, 0, nil
		}
		for {
			select {
			case b, ok := <-stdin:
				if !ok {
					return 0, 0, nil
				}
				if err := stdout(b); err != nil {
					return 0, 0, err
				}
			case s := <-signals:
				// Input the stream carried before the signal is queued
				// already (the receiver queues in stream order): write
				// it first, so that a signal sent after some input is
				// handled after it, whatever select picked.
				if err := drain(stdin, stdout); err != nil {
					return 0, 0, err
				}
				return -1, s, nil
			case <-ctx.Done():
				return -1, 9, nil
			}
		}
	case "sleep":
		secs := 0.0
		if len(argv) > 1 {
			secs, _ = strconv.ParseFloat(argv[1], 64)
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
			return 0, 0, nil
		case s := <-signals:
			return -1, s, nil
		case <-ctx.Done():
			return -1, 9, nil
		}
	case "printf":
		if len(argv) < 2 {
			return 1, 0, stderr([]byte("printf: usage: printf FORMAT [ARGS]\n"))
		}
		return 0, 0, stdout([]byte(printf(argv[1], argv[2:])))
	default:
		return 127, 0, stderr([]byte("fake: " + argv[0] + ": command not found\n"))
	}
}

// drain writes the input already queued on stdin, without waiting for more.
func drain(stdin <-chan []byte, stdout func([]byte) error) error {
	for {
		select {
		case b, ok := <-stdin:
			if !ok {
				return nil
			}
			if err := stdout(b); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// runScript runs sh -c's script (see Exec): its status is its last
// command's, or that of exit, or the signal of kill -N $$.
func (a *agent) runScript(ctx context.Context, script string, stdinOpen bool, stdin <-chan []byte, signals <-chan int32, stdout, stderr func([]byte) error) (int32, int32, error) {
	var code int32
	for _, argv := range shellCommands(script) {
		out := stdout
		if argv[len(argv)-1] == ">&2" {
			out, argv = stderr, argv[:len(argv)-1]
			if len(argv) == 0 {
				continue
			}
		}
		if argv[0] == "kill" {
			if len(argv) == 3 && argv[2] == "$$" && strings.HasPrefix(argv[1], "-") {
				if n, err := strconv.Atoi(argv[1][1:]); err == nil && n > 0 && n < 65 {
					return -1, int32(n), nil
				}
			}
			code = 1
			if err := stderr([]byte("fake: kill: only kill -N $$ is supported\n")); err != nil {
				return 0, 0, err
			}
			continue
		}
		if !fakeCommands[argv[0]] {
			code = 127
			if err := stderr([]byte("fake: " + argv[0] + ": command not found\n")); err != nil {
				return 0, 0, err
			}
			continue
		}
		c, sig, err := a.runCommand(ctx, argv, stdinOpen, stdin, signals, out, stderr)
		if err != nil || sig != 0 {
			return c, sig, err
		}
		code = c
		if argv[0] == "exit" {
			return code, 0, nil
		}
	}
	return code, 0, nil
}

// shellCommands splits script into commands on ';' and each into words on
// blanks, with single quotes (no other shell syntax); empty commands are
// dropped.
func shellCommands(script string) [][]string {
	var (
		cmds    [][]string
		words   []string
		word    strings.Builder
		inWord  bool
		inQuote bool
	)
	endWord := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func() {
		endWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for _, r := range script {
		switch {
		case inQuote && r == '\'':
			inQuote = false
		case inQuote:
			word.WriteRune(r)
		case r == '\'':
			inQuote, inWord = true, true
		case r == ';' || r == '\n':
			endCmd()
		case r == ' ' || r == '\t':
			endWord()
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	endCmd()
	return cmds
}

// printf formats like printf(1) for %s, %%, \n, \t and \\; anything else
// is copied as is.
func printf(format string, args []string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if i+1 == len(format) || (c != '\\' && c != '%') {
			b.WriteByte(c)
			continue
		}
		i++
		switch next := format[i]; {
		case c == '\\' && next == 'n':
			b.WriteByte('\n')
		case c == '\\' && next == 't':
			b.WriteByte('\t')
		case c == '\\' && next == '\\', c == '%' && next == '%':
			b.WriteByte(next)
		case c == '%' && next == 's':
			if len(args) > 0 {
				b.WriteString(args[0])
				args = args[1:]
			}
		default:
			b.WriteByte(c)
			b.WriteByte(next)
		}
	}
	return b.String()
}

// catChunk is the most one stdout event of cat FILE carries.
const catChunk = 64 << 10

// catFiles writes the files at paths to stdout, in chunks; a missing one
// or a directory is reported on stderr and makes the status 1.
func (a *agent) catFiles(paths []string, stdout, stderr func([]byte) error) (int32, int32, error) {
	var code int32
	for _, p := range paths {
		a.fs.mu.Lock()
		e, ok := a.fs.files[path.Clean(p)]
		var data []byte
		if ok && !e.dir {
			data = e.data // never changed in place: a write replaces it
		}
		a.fs.mu.Unlock()
		if !ok || e.dir {
			code = 1
			msg := "No such file or directory"
			if ok {
				msg = "Is a directory"
			}
			if err := stderr([]byte("cat: " + p + ": " + msg + "\n")); err != nil {
				return 0, 0, err
			}
			continue
		}
		for len(data) > 0 {
			n := min(len(data), catChunk)
			if err := stdout(data[:n]); err != nil {
				return 0, 0, err
			}
			data = data[n:]
		}
	}
	return code, 0, nil
}

// --- FileService ---

func cleanPath(p string) (string, error) {
	if !path.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path must be absolute"))
	}
	return path.Clean(p), nil
}

func notFound() error {
	return connect.NewError(connect.CodeNotFound, errors.New("no such file or directory"))
}

func (f *fs) info(p string, e *file) *agentv1.FileInfo {
	t := agentv1.FileType_FILE_TYPE_REGULAR
	if e.dir {
		t = agentv1.FileType_FILE_TYPE_DIRECTORY
	}
	return &agentv1.FileInfo{
		Path: p, Name: path.Base(p), Type: t, Size: uint64(len(e.data)),
		Mode: e.mode, MtimeUnixNano: e.mtime.UnixNano(),
	}
}

func (a *agent) Stat(_ context.Context, req *connect.Request[agentv1.StatRequest]) (*connect.Response[agentv1.StatResponse], error) {
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	e := a.fs.files[p]
	if e == nil {
		return nil, notFound()
	}
	return connect.NewResponse(&agentv1.StatResponse{Info: a.fs.info(p, e)}), nil
}

func (a *agent) List(_ context.Context, req *connect.Request[agentv1.ListRequest]) (*connect.Response[agentv1.ListResponse], error) {
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(max(req.Msg.GetDepth(), 1))
	limit := int(req.Msg.GetMaxEntries())
	if limit == 0 {
		limit = 10000
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if e := a.fs.files[p]; e == nil || !e.dir {
		return nil, notFound()
	}
	resp := &agentv1.ListResponse{}
	for _, q := range slices.Sorted(maps.Keys(a.fs.files)) {
		rel := strings.TrimPrefix(q, strings.TrimSuffix(p, "/")+"/")
		if q == p || rel == q || strings.Count(rel, "/") >= depth {
			continue
		}
		if len(resp.Entries) == limit {
			resp.Truncated = true
			break
		}
		resp.Entries = append(resp.Entries, a.fs.info(q, a.fs.files[q]))
	}
	return connect.NewResponse(resp), nil
}

// mkdirLocked creates p (and its parents if parents).
func (f *fs) mkdirLocked(p string, mode uint32, parents bool) error {
	if e := f.files[p]; e != nil {
		if e.dir && parents {
			return nil
		}
		return connect.NewError(connect.CodeAlreadyExists, errors.New("file exists"))
	}
	parent := path.Dir(p)
	if pe := f.files[parent]; pe == nil {
		if !parents {
			return notFound()
		}
		if err := f.mkdirLocked(parent, 0o755, true); err != nil {
			return err
		}
	} else if !pe.dir {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("not a directory"))
	}
	if mode == 0 {
		mode = 0o755
	}
	f.files[p] = &file{dir: true, mode: mode, mtime: time.Now()}
	return nil
}

func (a *agent) Mkdir(_ context.Context, req *connect.Request[agentv1.MkdirRequest]) (*connect.Response[agentv1.MkdirResponse], error) {
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if err := a.fs.mkdirLocked(p, req.Msg.GetMode(), req.Msg.GetParents()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&agentv1.MkdirResponse{}), nil
}

func (a *agent) Remove(_ context.Context, req *connect.Request[agentv1.RemoveRequest]) (*connect.Response[agentv1.RemoveResponse], error) {
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("cannot remove /"))
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	e := a.fs.files[p]
	if e == nil {
		return nil, notFound()
	}
	prefix := p + "/"
	var children []string
	for q := range a.fs.files {
		if strings.HasPrefix(q, prefix) {
			children = append(children, q)
		}
	}
	if len(children) > 0 && !req.Msg.GetRecursive() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("directory not empty"))
	}
	for _, q := range children {
		delete(a.fs.files, q)
	}
	delete(a.fs.files, p)
	return connect.NewResponse(&agentv1.RemoveResponse{}), nil
}

func (a *agent) Rename(_ context.Context, req *connect.Request[agentv1.RenameRequest]) (*connect.Response[agentv1.RenameResponse], error) {
	from, err := cleanPath(req.Msg.GetFrom())
	if err != nil {
		return nil, err
	}
	to, err := cleanPath(req.Msg.GetTo())
	if err != nil {
		return nil, err
	}
	if to == from || strings.HasPrefix(to, from+"/") {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("cannot move a directory into itself"))
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if a.fs.files[from] == nil {
		return nil, notFound()
	}
	if parent := a.fs.files[path.Dir(to)]; parent == nil || !parent.dir {
		return nil, notFound()
	}
	moved := map[string]*file{}
	for q, f := range a.fs.files {
		if q == from || strings.HasPrefix(q, from+"/") {
			moved[to+strings.TrimPrefix(q, from)] = f
			delete(a.fs.files, q)
		}
	}
	maps.Copy(a.fs.files, moved)
	return connect.NewResponse(&agentv1.RenameResponse{}), nil
}

// Watch is not faked: the real agent's is tested in the guest.
func (a *agent) Watch(context.Context, *connect.Request[agentv1.WatchRequest], *connect.ServerStream[agentv1.WatchResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("the fake agent does not watch files"))
}

func (a *agent) Read(_ context.Context, req *connect.Request[agentv1.ReadRequest], st *connect.ServerStream[agentv1.ReadResponse]) error {
	p, err := cleanPath(req.Msg.GetPath())
	if err != nil {
		return err
	}
	a.fs.mu.Lock()
	e := a.fs.files[p]
	var info *agentv1.FileInfo
	var data []byte
	if e != nil {
		info, data = a.fs.info(p, e), bytes.Clone(e.data)
	}
	a.fs.mu.Unlock()
	if e == nil {
		return notFound()
	}
	if e.dir {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("is a directory"))
	}
	if err := st.Send(&agentv1.ReadResponse{Msg: &agentv1.ReadResponse_Info{Info: info}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), agentapi.ChunkSize)
		if err := st.Send(&agentv1.ReadResponse{Msg: &agentv1.ReadResponse_Data{Data: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (a *agent) Write(_ context.Context, st *connect.ClientStream[agentv1.WriteRequest]) (*connect.Response[agentv1.WriteResponse], error) {
	if !st.Receive() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("empty write stream: %w", st.Err()))
	}
	h := st.Msg().GetHeader()
	if h == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("first message must be the header"))
	}
	p, err := cleanPath(h.GetPath())
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for st.Receive() {
		buf.Write(st.Msg().GetData())
	}
	if err := st.Err(); err != nil {
		return nil, err // a failed write leaves the old file intact
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	parent := path.Dir(p)
	if pe := a.fs.files[parent]; pe == nil {
		if !h.GetParents() {
			return nil, notFound()
		}
		if err := a.fs.mkdirLocked(parent, 0o755, true); err != nil {
			return nil, err
		}
	} else if !pe.dir {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not a directory"))
	}
	if e := a.fs.files[p]; e != nil && e.dir {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("is a directory"))
	}
	mode := h.GetMode()
	if mode == 0 {
		mode = 0o644
	}
	a.fs.files[p] = &file{data: buf.Bytes(), mode: mode, mtime: time.Now()}
	return connect.NewResponse(&agentv1.WriteResponse{BytesWritten: uint64(buf.Len())}), nil
}
