package agent

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// jupyterDelim separates routing frames from a Jupyter message.
const jupyterDelim = "<IDS|MSG>"

// kernelLauncher starts the ipykernel kernel as `python3 -m
// ipykernel_launcher` does (the working directory off sys.path while it
// loads; IPython puts it back), but with debugpy kept out of its start:
// ipykernel imports it (and, through it, pkg_resources) only to offer
// Jupyter's debugger, which no airlock surface speaks, and that was about
// 0.6 s of a 2.3 s start under gVisor. ipykernel then runs without its
// debugger; code that imports debugpy itself still gets it.
// One line, so that ps shows it whole.
const kernelLauncher = `import sys; sys.path[0] == "" and sys.path.pop(0); sys.modules["debugpy"] = None; from ipykernel import kernelapp; del sys.modules["debugpy"]; kernelapp.launch_new_instance()`

// pythonInterp is an ipykernel Jupyter kernel spoken to over ZeroMQ
// (messaging protocol 5.3): execute_request on the shell socket, outputs
// from IOPub until the kernel reports idle for the request. Interrupts are
// SIGINT to the kernel's process group (ipykernel's default "signal"
// interrupt mode; an idle kernel ignores SIGINT).
type pythonInterp struct {
	p       *process
	dir     string
	key     []byte
	session string
	shell   zmq4.Socket
	iopub   zmq4.Socket
	cancel  context.CancelFunc // of the sockets
	isDead  <-chan struct{}
	end     *ending
	once    sync.Once
	loops   sync.WaitGroup

	mu      sync.Mutex
	replies map[string]chan *jmsg // shell replies awaited, by parent msg_id
	watch   string                // msg_id whose IOPub messages go to sub
	sub     chan *jmsg
}

type jheader struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

type jmsg struct {
	Header  jheader
	Parent  jheader
	Content json.RawMessage
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freePorts picks n free TCP ports on 127.0.0.1. The kernel binds them
// right after; a port taken in between makes the start fail.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func startPython(sp *ctxSpawn) (_ interp, err error) {
	path, err := sp.program(sp.s.progs.Python, "python3")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, sysError("pick kernel ports", err)
	}
	key := randHex(32)
	conn, _ := json.Marshal(map[string]any{
		"shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
		"control_port": ports[3], "hb_port": ports[4],
		"ip": "127.0.0.1", "transport": "tcp", "key": key,
		"signature_scheme": "hmac-sha256", "kernel_name": "python3",
	})
	connFile := filepath.Join(sp.dir, "kernel.json")
	if err := os.WriteFile(connFile, conn, 0o600); err != nil {
		return nil, sysError("write connection file", err)
	}
	if envValue(sp.env, "MPLBACKEND") == "" {
		// matplotlib-inline is a dependency of ipykernel: figures become
		// image/png display_data.
		sp.env = append(sp.env, "MPLBACKEND=module://matplotlib_inline.backend_inline")
	}
	sp.env = append(sp.env, "PYTHONUNBUFFERED=1", "JPY_PARENT_PID=1")
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, sysError("open /dev/null", err)
	}
	defer null.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	defer outW.Close()
	p, err := sp.spawn(path, []string{"python3", "-c", kernelLauncher, "-f", connFile}, null, outW, outW)
	if err != nil {
		outR.Close()
		return nil, err
	}
	p.stdout = outR
	ctx, cancel := context.WithCancel(context.Background())
	k := &pythonInterp{p: p, dir: sp.dir, key: []byte(key), session: randHex(16), cancel: cancel, replies: map[string]chan *jmsg{}}
	k.end = watch(p)
	k.isDead = k.end.dead
	logs := &tailWriter{max: 4 << 10}
	k.loops.Go(func() {
		// The kernel's own stdout/stderr (startup errors, fd output not
		// captured by ipykernel): kept for the start error.
		_, _ = io.Copy(logs, outR)
		outR.Close()
	})
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	retry := []zmq4.Option{quiet, zmq4.WithDialerRetry(50 * time.Millisecond), zmq4.WithDialerMaxRetries(int(startTimeout / (50 * time.Millisecond)))}
	k.shell = zmq4.NewDealer(ctx, retry...)
	k.iopub = zmq4.NewSub(ctx, retry...)
	fail := func(step string, err error) (interp, error) {
		k.close()
		msg := step
		if t := strings.TrimSpace(logs.String()); t != "" {
			msg += ": " + lastLine(t)
		}
		return nil, preconditionf("start python kernel: %s", msg)
	}
	go func() {
		select {
		case <-k.isDead:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fail("subscribe", err)
	}
	if err := k.iopub.Dial("tcp://127.0.0.1:" + itoa(ports[1])); err != nil {
		return fail("connect iopub", err)
	}
	if err := k.shell.Dial("tcp://127.0.0.1:" + itoa(ports[0])); err != nil {
		return fail("connect shell", err)
	}
	k.loops.Go(k.shellLoop)
	k.loops.Go(k.iopubLoop)
	if err := k.waitReady(ctx); err != nil {
		return fail("wait for the kernel", err)
	}
	return k, nil
}

func itoa(i int) string { return strconv.Itoa(i) }

// waitReady sends kernel_info_request until one gets both its shell reply
// and its IOPub status, which proves the subscription is live.
func (k *pythonInterp) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		id, reply, iopub, err := k.request("kernel_info_request", map[string]any{})
		if err != nil {
			return err
		}
		gotReply, gotStatus := false, false
		t := time.NewTimer(500 * time.Millisecond)
	wait:
		for !gotReply || !gotStatus {
			select {
			case <-reply:
				gotReply = true
			case m := <-iopub:
				if m.Header.MsgType == "status" {
					gotStatus = true
				}
			case <-t.C:
				break wait
			case <-ctx.Done():
				t.Stop()
				k.forget(id)
				return errors.New("the kernel exited")
			}
		}
		t.Stop()
		k.forget(id)
		if gotReply && gotStatus {
			return nil
		}
	}
	return errors.New("timed out")
}

// request sends a shell request and registers for its reply and IOPub
// messages.
func (k *pythonInterp) request(msgType string, content any) (id string, reply, iopub chan *jmsg, err error) {
	id = randHex(16)
	reply, iopub = make(chan *jmsg, 1), make(chan *jmsg, 256)
	k.mu.Lock()
	k.replies[id] = reply
	k.watch, k.sub = id, iopub
	k.mu.Unlock()
	if err := k.shell.Send(k.encode(id, msgType, content)); err != nil {
		k.forget(id)
		return "", nil, nil, err
	}
	return id, reply, iopub, nil
}

func (k *pythonInterp) forget(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.replies, id)
	if k.watch == id {
		k.watch, k.sub = "", nil
	}
}

func (k *pythonInterp) encode(id, msgType string, content any) zmq4.Msg {
	h, _ := json.Marshal(jheader{
		MsgID: id, Session: k.session, Username: "airlock", MsgType: msgType, Version: "5.3",
		Date: time.Now().UTC().Format(time.RFC3339Nano),
	})
	c, _ := json.Marshal(content)
	parent, meta := []byte("{}"), []byte("{}")
	return zmq4.NewMsgFrom([]byte(jupyterDelim), []byte(k.sign(h, parent, meta, c)), h, parent, meta, c)
}

func (k *pythonInterp) sign(parts ...[]byte) string {
	m := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		m.Write(p)
	}
	return hex.EncodeToString(m.Sum(nil))
}

// decode parses and verifies a received message; nil if it is not a valid
// signed Jupyter message.
func (k *pythonInterp) decode(frames [][]byte) *jmsg {
	i := 0
	for i < len(frames) && string(frames[i]) != jupyterDelim {
		i++
	}
	if len(frames) < i+6 {
		return nil
	}
	f := frames[i+1:]
	want := k.sign(f[1], f[2], f[3], f[4])
	if !hmac.Equal([]byte(want), f[0]) {
		return nil
	}
	m := &jmsg{Content: f[4]}
	if json.Unmarshal(f[1], &m.Header) != nil {
		return nil
	}
	_ = json.Unmarshal(f[2], &m.Parent)
	return m
}

func (k *pythonInterp) shellLoop() {
	for {
		raw, err := k.shell.Recv()
		if err != nil {
			return
		}
		m := k.decode(raw.Frames)
		if m == nil {
			continue
		}
		k.mu.Lock()
		ch := k.replies[m.Parent.MsgID]
		delete(k.replies, m.Parent.MsgID)
		k.mu.Unlock()
		if ch != nil {
			ch <- m // buffered, one reply
		}
	}
}

func (k *pythonInterp) iopubLoop() {
	for {
		raw, err := k.iopub.Recv()
		if err != nil {
			return
		}
		m := k.decode(raw.Frames)
		if m == nil {
			continue
		}
		k.mu.Lock()
		if k.watch != "" && m.Parent.MsgID == k.watch {
			select {
			case k.sub <- m:
			default:
				// The run is not reading (it ended): drop.
			}
		}
		k.mu.Unlock()
	}
}

// figuresOpen is a user expression evaluated after each run: whether
// matplotlib's pyplot is loaded (never imported here: that costs seconds)
// and holds open figures.
const figuresOpen = "__import__('sys').modules.get('matplotlib.pyplot') is not None and " +
	"bool(__import__('sys').modules['matplotlib.pyplot'].get_fignums())"

// captureFigures runs silently (no history, no execution count, no
// post-execute hooks) after a run that left figures open: each comes back
// as an image/png display_data, as the inline backend sends them, and is
// closed. Figures stay open when the code picked a backend that shows
// nothing (matplotlib.use('Agg'), then plt.show() or plt.savefig()).
const captureFigures = `def __airlock_figures():
    import sys
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is None:
        return
    import base64, io
    from IPython.display import publish_display_data
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format='png', bbox_inches='tight')
        except Exception as e:
            print('[airlock: figure %s could not be saved as PNG: %s]' % (num, e), file=sys.stderr)
            continue
        publish_display_data({'image/png': base64.b64encode(buf.getvalue()).decode('ascii'), 'text/plain': repr(fig)})
    plt.close('all')
try:
    __airlock_figures()
finally:
    del __airlock_figures
`

// run executes code, then sends the figures it left open (see
// captureFigures).
// warmCode is a warm kernel's first code: what the first user code of a
// sandbox would otherwise wait for.
const warmCode = "import random, tempfile"

// reseedCode seeds what a kernel cloned with its sandbox would otherwise
// share with every other clone: the random module (from os.urandom, which
// the clone's Sync reseeded) and tempfile's name sequence (made again on
// its next use). The hash secret (PYTHONHASHSEED) stays the template's.
const reseedCode = "import random as _airlock_random, tempfile as _airlock_tempfile\n" +
	"_airlock_random.seed()\n_airlock_tempfile._name_sequence = None\n" +
	"del _airlock_random, _airlock_tempfile"

func (k *pythonInterp) warmUp(ctx context.Context) error { return k.silent(ctx, warmCode) }

func (k *pythonInterp) reseed(ctx context.Context) error { return k.silent(ctx, reseedCode) }

// silent runs code without output or history; an exception in it is an
// error.
func (k *pythonInterp) silent(ctx context.Context, code string) error {
	id, reply, _, err := k.request("execute_request", map[string]any{
		"code": code, "silent": true, "store_history": false,
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": true,
	})
	if err != nil {
		return err
	}
	defer k.forget(id)
	select {
	case r := <-reply:
		var c struct {
			Status string `json:"status"`
			EName  string `json:"ename"`
		}
		if r == nil || json.Unmarshal(r.Content, &c) != nil || c.Status != "ok" {
			return fmt.Errorf("the kernel answered %q %s", c.Status, c.EName)
		}
		return nil
	case <-k.isDead:
		return errors.New("the kernel exited")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *pythonInterp) run(ctx context.Context, code string, out *codeOutput) (int32, error) {
	count, figures, err := k.execute(ctx, code, false, out)
	if err != nil || !figures || isClosed(k.isDead) {
		return count, err
	}
	_, _, err = k.execute(ctx, captureFigures, true, out)
	return count, err
}

// execute runs one execute_request and forwards its IOPub messages until
// the kernel is idle. figures is true unless the kernel's reply says that
// no figure is open (a failed run's reply says nothing).
func (k *pythonInterp) execute(ctx context.Context, code string, silent bool, out *codeOutput) (count int32, figures bool, err error) {
	exprs := map[string]any{}
	if !silent {
		exprs["airlock_figures"] = figuresOpen
	}
	id, reply, iopub, err := k.request("execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		"user_expressions": exprs, "allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return 0, false, nil // the kernel is gone; dead() tells
	}
	defer k.forget(id)
	// The reply comes on the shell socket, around the time of the idle
	// status on IOPub.
	replyFigures := func() bool {
		var r *jmsg
		select {
		case r = <-reply:
		case <-k.isDead:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Second):
			return true
		}
		var c struct {
			Status string `json:"status"`
			Exprs  map[string]struct {
				Status string            `json:"status"`
				Data   map[string]string `json:"data"`
			} `json:"user_expressions"`
		}
		if json.Unmarshal(r.Content, &c) != nil || c.Status != "ok" {
			return true
		}
		e := c.Exprs["airlock_figures"]
		return e.Status != "ok" || e.Data["text/plain"] != "False"
	}
	for {
		select {
		case m := <-iopub:
			var c struct {
				Name           string                     `json:"name"`
				Text           string                     `json:"text"`
				Data           map[string]json.RawMessage `json:"data"`
				ExecutionState string                     `json:"execution_state"`
				ExecutionCount int32                      `json:"execution_count"`
				EName          string                     `json:"ename"`
				EValue         string                     `json:"evalue"`
				Traceback      []string                   `json:"traceback"`
			}
			if json.Unmarshal(m.Content, &c) != nil {
				continue
			}
			switch m.Header.MsgType {
			case "stream":
				out.text(c.Name == "stderr", []byte(c.Text))
			case "execute_input":
				count = c.ExecutionCount
			case "execute_result", "display_data":
				if m.Header.MsgType == "execute_result" && c.ExecutionCount > 0 {
					count = c.ExecutionCount
				}
				if data := mimeBundle(c.Data); len(data) > 0 {
					out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{
						Data: data, IsMainResult: m.Header.MsgType == "execute_result",
					}}})
				}
			case "error":
				tb := make([]string, len(c.Traceback))
				for i, l := range c.Traceback {
					tb[i] = ansiRe().ReplaceAllString(l, "")
				}
				out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
					Name: c.EName, Value: c.EValue, Traceback: tb,
				}}})
			case "status":
				if c.ExecutionState == "idle" {
					return count, !silent && replyFigures(), nil
				}
			}
		case <-k.isDead:
			return count, false, nil
		case <-ctx.Done():
			return count, false, ctx.Err()
		}
	}
}

var ansiRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`) })

// mimeBundle keeps the MIME types the API carries: text as UTF-8, JSON
// re-marshaled, PNG and JPEG decoded to raw bytes.
func mimeBundle(in map[string]json.RawMessage) map[string][]byte {
	out := map[string][]byte{}
	for typ, raw := range in {
		switch typ {
		case "text/plain", "text/html", "text/markdown", "image/svg+xml":
			if s, ok := jsonText(raw); ok {
				out[typ] = []byte(s)
			}
		case "application/json":
			var v any
			if json.Unmarshal(raw, &v) == nil {
				b, _ := json.Marshal(v)
				out[typ] = b
			}
		case "image/png", "image/jpeg":
			if s, ok := jsonText(raw); ok {
				s = strings.Map(func(r rune) rune {
					if r == '\n' || r == '\r' || r == ' ' {
						return -1
					}
					return r
				}, s)
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					out[typ] = b
				}
			}
		}
	}
	return out
}

// jsonText reads a string, or a list of strings (nbformat style), joined.
func jsonText(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var l []string
	if json.Unmarshal(raw, &l) == nil {
		return strings.Join(l, ""), true
	}
	return "", false
}

func (k *pythonInterp) interrupt() {
	_ = k.p.reaper.Signal(k.p.pid, syscall.SIGINT, true)
}

func (k *pythonInterp) dead() <-chan struct{} { return k.isDead }

func (k *pythonInterp) exit() *agentv1.ContextExit { return k.end.get() }

func (k *pythonInterp) close() {
	k.once.Do(func() {
		stopProcess(k.p, k.isDead)
		k.cancel()
		_ = k.shell.Close()
		_ = k.iopub.Close()
		unblock(k.p.stdout)
		k.loops.Wait()
		removeRunDir(k.dir)
	})
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = w.buf[len(w.buf)-w.max:]
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return truncate(strings.TrimSpace(lines[len(lines)-1]))
}

// splitLines splits a stack trace into lines.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimRight(s, "\n"), "\n")
}
