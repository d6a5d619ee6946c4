package agent

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// nodeDriver evaluates code in one persistent REPL context; see the file.
//
//go:embed context_driver.js
var nodeDriver []byte

// nodeInterp is `node driver.js`: requests go as JSON lines on its fd 3,
// events come back as JSON lines on its fd 4. The driver routes
// process.stdout/stderr writes (and so console.*) through the events, so
// output and the end of a call arrive in order; what escapes (child
// processes, native writes) is forwarded from the real stdout/stderr.
type nodeInterp struct {
	p      *process
	dir    string
	req    *os.File
	events *os.File
	evc    chan nodeEvent
	isDead <-chan struct{}
	end    *ending
	stop   chan struct{} // closed by close
	once   sync.Once
	n      int

	mu   sync.Mutex
	sink func(stderr bool, b []byte)
}

type nodeEvent struct {
	T       string `json:"t"`
	D       string `json:"d"`
	Text    string `json:"text"`
	Name    string `json:"name"`
	Message string `json:"message"`
	Stack   string `json:"stack"`
	ID      int    `json:"id"`
}

func startNode(sp *ctxSpawn) (_ interp, err error) {
	path, err := sp.program(sp.s.progs.Node, "node")
	if err != nil {
		return nil, err
	}
	script := filepath.Join(sp.dir, "driver.js")
	if err := os.WriteFile(script, nodeDriver, 0o600); err != nil {
		return nil, sysError("write driver", err)
	}
	var closers []*os.File
	defer func() {
		for _, f := range closers {
			f.Close()
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			closers = append(closers, r, w)
		}
		return r, w, err
	}
	reqR, reqW, err := pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	evR, evW, err := pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	outR, outW, err := pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, sysError("open /dev/null", err)
	}
	defer null.Close()
	sp.extra = []*os.File{reqR, evW}
	p, err := sp.spawn(path, []string{"node", script}, null, outW, errW)
	if err != nil {
		return nil, err
	}
	closers = []*os.File{reqR, evW, outW, errW} // the child's ends
	p.stdout, p.stderr = outR, errR
	n := &nodeInterp{p: p, dir: sp.dir, req: reqW, events: evR, evc: make(chan nodeEvent, 64), stop: make(chan struct{})}
	n.end = watch(p)
	n.isDead = n.end.dead
	go n.pump(outR, false)
	go n.pump(errR, true)
	go n.readEvents()
	return n, nil
}

func (n *nodeInterp) pump(f *os.File, stderr bool) {
	defer f.Close()
	buf := make([]byte, outputChunk)
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n.mu.Lock()
			sink := n.sink
			n.mu.Unlock()
			if sink != nil {
				sink(stderr, buf[:k])
			}
		}
		if err != nil {
			return
		}
	}
}

func (n *nodeInterp) readEvents() {
	defer close(n.evc)
	defer n.events.Close()
	sc := bufio.NewScanner(n.events)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev nodeEvent
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		select {
		case n.evc <- ev:
		case <-n.stop:
			return
		}
	}
}

func (n *nodeInterp) run(ctx context.Context, code string, out *codeOutput) (int32, error) {
	n.n++
	id := n.n
	// Drop what came between calls (output of timers, late "done"s).
	for drained := false; !drained; {
		select {
		case <-n.evc:
		default:
			drained = true
		}
	}
	line, _ := json.Marshal(map[string]any{"id": id, "code": code})
	n.mu.Lock()
	n.sink = out.text
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.sink = nil
		n.mu.Unlock()
	}()
	if _, err := n.req.Write(append(line, '\n')); err != nil {
		return 0, nil // node is gone; dead() tells
	}
	for {
		select {
		case ev, ok := <-n.evc:
			if !ok {
				<-n.isDead
				return 0, nil
			}
			switch ev.T {
			case "stdout", "stderr":
				b, _ := base64.StdEncoding.DecodeString(ev.D)
				out.text(ev.T == "stderr", b)
			case "result":
				out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{
					Data: map[string][]byte{"text/plain": []byte(ev.Text)}, IsMainResult: true,
				}}})
			case "error":
				out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
					Name: ev.Name, Value: ev.Message, Traceback: splitLines(ev.Stack),
				}}})
			case "done":
				if ev.ID == id {
					return 0, nil
				}
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (n *nodeInterp) interrupt() {
	_ = n.p.reaper.Signal(n.p.pid, syscall.SIGINT, true)
}

func (n *nodeInterp) dead() <-chan struct{} { return n.isDead }

func (n *nodeInterp) exit() *agentv1.ContextExit { return n.end.get() }

func (n *nodeInterp) close() {
	n.once.Do(func() {
		_ = n.req.Close()
		close(n.stop)
		stopProcess(n.p, n.isDead)
		unblock(n.p.stdout, n.p.stderr, n.events)
		removeRunDir(n.dir)
	})
}
