package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// bashInterp is a persistent `bash --noprofile --norc` fed commands on a
// pipe. Each snippet is written to a file in the private dir and sourced
// (stdin from /dev/null) on one line; the next line prints a marker with
// the status on stdout and a marker on stderr, so the end of both streams
// is known. SIGINT is trapped to return from the sourced snippet, so an
// interrupt ends the snippet and not the shell.
type bashInterp struct {
	p      *process
	dir    string
	marker string
	stdin  *os.File
	isDead <-chan struct{}
	end    *ending
	once   sync.Once

	mu   sync.Mutex
	sink func(stderr bool, b []byte) // the current run's; nil between runs
	outs chan bashMark               // markers seen, by stream
	n    int
}

type bashMark struct {
	stderr bool
	run    int // the run that printed it (bashInterp.n)
	status int
}

func startBash(sp *ctxSpawn) (_ interp, err error) {
	path, err := sp.program(sp.s.progs.Bash, "bash")
	if err != nil {
		return nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inW.Close()
		return nil, sysError("pipe", err)
	}
	defer outW.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, sysError("pipe", err)
	}
	defer errW.Close()
	p, err := sp.spawn(path, []string{"bash", "--noprofile", "--norc"}, inR, outW, errW)
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, err
	}
	p.stdout, p.stderr = outR, errR
	var m [8]byte
	_, _ = rand.Read(m[:])
	b := &bashInterp{p: p, dir: sp.dir, marker: "__airlock_" + hex.EncodeToString(m[:]) + "_", stdin: inW, outs: make(chan bashMark, 4)}
	b.end = watch(p)
	b.isDead = b.end.dead
	go b.pump(outR, false)
	go b.pump(errR, true)
	// A trapped INT between snippets is ignored; children get the default.
	if _, err := fmt.Fprintf(inW, "trap : INT\n"); err != nil {
		b.close()
		return nil, sysError("start bash", err)
	}
	return b, nil
}

// pump forwards one stream to the current run, cutting out markers.
func (b *bashInterp) pump(f *os.File, stderr bool) {
	buf := make([]byte, outputChunk)
	var pending []byte
	mk := []byte(b.marker)
	for {
		n, err := f.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, mk)
			if i < 0 {
				break
			}
			nl := bytes.IndexByte(pending[i:], '\n')
			if nl < 0 {
				break
			}
			b.forward(stderr, pending[:i])
			// The marker is followed by "RUN:STATUS".
			runStr, statusStr, _ := strings.Cut(string(pending[i+len(mk):i+nl]), ":")
			run, _ := strconv.Atoi(runStr)
			status, _ := strconv.Atoi(statusStr)
			pending = pending[i+nl+1:]
			b.outs <- bashMark{stderr: stderr, run: run, status: status}
		}
		// Keep what could be the start of a marker.
		keep := 0
		for k := min(len(mk), len(pending)); k > 0; k-- {
			if bytes.HasSuffix(pending, mk[:k]) {
				keep = k
				break
			}
		}
		if i := bytes.Index(pending, mk); i >= 0 {
			keep = len(pending) - i
		}
		b.forward(stderr, pending[:len(pending)-keep])
		pending = append([]byte(nil), pending[len(pending)-keep:]...)
		if err != nil {
			f.Close()
			return
		}
	}
}

func (b *bashInterp) forward(stderr bool, p []byte) {
	if len(p) == 0 {
		return
	}
	b.mu.Lock()
	sink := b.sink
	b.mu.Unlock()
	if sink != nil {
		sink(stderr, p)
	}
}

func (b *bashInterp) run(ctx context.Context, code string, out *codeOutput) (int32, error) {
	b.n++
	file := filepath.Join(b.dir, "snippet.sh")
	if err := os.WriteFile(file, []byte(code), 0o600); err != nil {
		return 0, sysError("write snippet", err)
	}
	b.mu.Lock()
	b.sink = out.text
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.sink = nil
		b.mu.Unlock()
	}()
	// The markers carry the run's number: those of an earlier run that
	// timed out (its snippet went on) are told apart and skipped.
	cmd := fmt.Sprintf("trap 'return 130' INT; . %s </dev/null\n__airlock_rc=$?; trap : INT; printf '%%s%d:%%d\\n' %s \"$__airlock_rc\"; printf '%%s%d:0\\n' %s >&2\n",
		shellQuote(file), b.n, b.marker, b.n, b.marker)
	if _, err := b.stdin.WriteString(cmd); err != nil {
		return 0, nil // the shell is gone; dead() tells
	}
	status, seen := 0, 0
	for seen < 2 {
		select {
		case m := <-b.outs:
			if m.run != b.n {
				continue
			}
			seen++
			if !m.stderr {
				status = m.status
			}
		case <-b.isDead:
			return 0, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if status != 0 {
		out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
			Name: "ExitStatus", Value: strconv.Itoa(status),
		}}})
	}
	return 0, nil
}

func (b *bashInterp) interrupt() {
	_ = b.p.reaper.Signal(b.p.pid, syscall.SIGINT, true)
}

func (b *bashInterp) dead() <-chan struct{} { return b.isDead }

func (b *bashInterp) exit() *agentv1.ContextExit { return b.end.get() }

func (b *bashInterp) close() {
	b.once.Do(func() {
		_ = b.stdin.Close()
		stopProcess(b.p, b.isDead)
		unblock(b.p.stdout, b.p.stderr)
		removeRunDir(b.dir)
	})
}

// shellQuote quotes s for bash.
func shellQuote(s string) string {
	return "'" + string(bytes.ReplaceAll([]byte(s), []byte("'"), []byte(`'\''`))) + "'"
}
