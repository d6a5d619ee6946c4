package guest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// ErrExecExited is the answer to stdin or a signal for an exec that has
// exited (and been reaped: its pid may belong to another process now).
var ErrExecExited = errors.New("the exec has exited")

// ErrExecPaused ends an exec's output stream (Recv) when the sandbox was
// paused while the exec ran: the guest keeps the process, parked, and it
// goes on, under the same exec id, when the sandbox resumes (attach to it
// again then).
var ErrExecPaused = errors.New("the sandbox was paused while the exec ran; it goes on when the sandbox resumes (attach to it again then)")

// MaxExecTimeout is the longest timeout an exec may ask for.
const MaxExecTimeout = 24 * time.Hour

// ExecSpec is a command to run in a sandbox.
type ExecSpec struct {
	// Argv is the command; Argv[0] is looked up in PATH without a slash.
	Argv []string
	// Env is set over the sandbox's default environment (the shim merges
	// it: a spec's own variables win).
	Env map[string]string
	// Cwd is the working directory (absolute, clean); "" is the user's
	// home ("/" for root).
	Cwd string
	// User is a name or uid with an optional ":group"; "" is root.
	User string
	// Stdin gives the process a stdin fed through the exec's stream (else
	// /dev/null).
	Stdin bool
	// Timeout kills the process group after this long (0: never).
	Timeout time.Duration
	// PidsLimit caps processes and threads (0: the guest's default).
	PidsLimit uint32
	// MaxOutputBytes caps stdout+stderr kept (0: the shim's cap).
	MaxOutputBytes uint64
	// TTY, if set, runs the process on a new terminal of this size: its
	// stdin, stdout and stderr are the terminal (output comes as stdout,
	// echo included), and Stdin is implied.
	TTY *TermSize
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Rows, Cols uint32
}

// MaxTermSize bounds a terminal's rows and columns.
const MaxTermSize = 10000

// Validate checks the size: rows and cols 1..MaxTermSize.
func (t TermSize) Validate() error {
	if t.Rows < 1 || t.Rows > MaxTermSize || t.Cols < 1 || t.Cols > MaxTermSize {
		return fmt.Errorf("%w: terminal size %dx%d: rows and cols must be 1..%d", errdefs.ErrInvalid, t.Cols, t.Rows, MaxTermSize)
	}
	return nil
}

// Validate checks s; errors wrap errdefs.ErrInvalid and name only the
// spec's own values.
func (s ExecSpec) Validate() error {
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return fmt.Errorf("%w: cmd must be a non-empty array", errdefs.ErrInvalid)
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%w: env names must be non-empty without '=' or NUL, values without NUL", errdefs.ErrInvalid)
		}
	}
	if s.Cwd != "" && (!strings.HasPrefix(s.Cwd, "/") || path.Clean(s.Cwd) != s.Cwd || strings.IndexByte(s.Cwd, 0) >= 0 || len(s.Cwd) > 4096) {
		return fmt.Errorf("%w: cwd %q is not an absolute clean path", errdefs.ErrInvalid, s.Cwd)
	}
	if s.Timeout < 0 || s.Timeout > MaxExecTimeout {
		return fmt.Errorf("%w: exec timeout must be between 0 and 24h", errdefs.ErrInvalid)
	}
	if s.TTY != nil {
		return s.TTY.Validate()
	}
	return nil
}

// EnvList is s.Env as "KEY=VALUE" in key order.
func (s ExecSpec) EnvList() []string {
	out := make([]string, 0, len(s.Env))
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		out = append(out, k+"="+s.Env[k])
	}
	return out
}

// ExitStatus is how an exec ended.
type ExitStatus struct {
	// Code is the exit status if the process exited normally; -1 if it
	// was signalled.
	Code int
	// Signal ended the process (0: none).
	Signal int
	// TimedOut: the exec's timeout fired and its process group was killed.
	TimedOut bool
	// Truncated: output beyond the cap was dropped.
	Truncated bool
	Duration  time.Duration
	// OOMKilled: the guest kernel's OOM killer killed a process of the exec
	// (memory.events oom_kill of its cgroup).
	OOMKilled bool
}

// Exec states.
const (
	ExecStateRunning = "running"
	ExecStateExited  = "exited"
)

// ExecInfo describes an exec owned by a sandbox's shim.
type ExecInfo struct {
	ID        string // 20 characters [a-z2-7]
	Argv      []string
	PID       int
	State     string // ExecStateRunning or ExecStateExited
	StartedAt time.Time
	EndedAt   time.Time   // zero while running
	Exit      *ExitStatus // nil while running
	TTY       bool        // it runs on a terminal
}

// ExecEventKind says what an ExecEvent carries.
type ExecEventKind int

// Exec event kinds.
const (
	ExecStdout ExecEventKind = iota + 1
	ExecStderr
	ExecExited
)

// ExecEvent is one event of an exec's output stream: a chunk of stdout or
// stderr (Data), or its exit (Exit), which is always the last.
type ExecEvent struct {
	Kind ExecEventKind
	Data []byte
	Exit *ExitStatus
}

// ExecStream is one client's stream to an exec, from Start or Attach. Recv
// is called from one goroutine; Stdin, CloseStdin and Signal from any.
type ExecStream interface {
	// Info is the exec as the shim reported it when the stream opened.
	Info() ExecInfo
	// Recv returns the next output event; after the exit event it returns
	// io.EOF. A control stream (no output) returns io.EOF at once.
	Recv() (ExecEvent, error)
	// Stdin writes data to the exec's stdin (started with Stdin).
	Stdin(data []byte) error
	// CloseStdin closes the exec's stdin.
	CloseStdin() error
	// Signal sends sig (1..64) to the exec's process group.
	Signal(sig int) error
	// Resize sets the size of the exec's terminal (ErrFailedPrecondition
	// if it has none).
	Resize(size TermSize) error
	// Finish ends the client's side and, on a control stream, waits for the
	// shim's verdict on everything sent (nil: all of it was handed to the
	// guest).
	Finish() error
	// Close detaches: the exec keeps running unless it was started with
	// kill-on-detach and this was its last attacher. Safe to call twice.
	Close()
}

var execIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z2-7]{16}(?:[a-z2-7]{4})?$`) }) // 16: ids of shims started before ids grew

// ValidExecID reports whether id has the form of an exec id.
func ValidExecID(id string) bool { return execIDRe().MatchString(id) }

// NewExecID returns a fresh random exec id (20 characters [a-z2-7], 100
// bits). The shim mints them.
func NewExecID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	return string(b)
}

// ErrNoExec is the answer for an exec id the shim does not know (or a
// malformed one).
var ErrNoExec = fmt.Errorf("%w: exec not found", errdefs.ErrNotFound)

// IsNoExec reports whether err says the exec is unknown.
func IsNoExec(err error) bool { return errors.Is(err, ErrNoExec) }

// StartError is an exec the guest could not start for a reason of the
// program's own: no such executable, a working directory that does not
// exist, an unknown user, a file that is not executable. The sandbox is
// fine: surfaces answer it apart from "sandbox not found". Reason is the
// guest's (bounded, valid UTF-8); NotFound tells "not found" reasons (exit
// status 127 by shell convention) from the others (126).
type StartError struct {
	Reason   string
	NotFound bool
}

// StartNotFound begins the text of a StartError whose reason is a missing
// executable, cwd, user or group.
const StartNotFound = "the exec did not start (not found): "

func (e *StartError) Error() string {
	if e.NotFound {
		return StartNotFound + e.Reason
	}
	return "the exec did not start: " + e.Reason
}

// AsStartError returns err's StartError, if it is one.
func AsStartError(err error) (*StartError, bool) { return errors.AsType[*StartError](err) }

// Drain writes an exec's output to stdout and stderr (nil discards) until
// its exit and returns the exit status. A failed write kills the exec
// (nobody reads its output any more) and is returned.
func Drain(st ExecStream, stdout, stderr io.Writer) (*ExitStatus, error) {
	for {
		ev, err := st.Recv()
		if err != nil {
			return nil, err
		}
		var w io.Writer
		switch ev.Kind {
		case ExecExited:
			return ev.Exit, nil
		case ExecStdout:
			w = stdout
		case ExecStderr:
			w = stderr
		default:
			continue
		}
		if w == nil {
			continue
		}
		if _, err := w.Write(ev.Data); err != nil {
			_ = st.Signal(9)
			return nil, fmt.Errorf("write output: %w", err)
		}
	}
}
