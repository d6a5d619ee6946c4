package guest

import (
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// ContextSpec asks for a code context.
type ContextSpec struct {
	// ID is [a-z0-9][a-z0-9-]{0,62}; "" gets a generated one.
	ID string
	// Language is "python" ("" too), "javascript" or "bash".
	Language string
	// Cwd is the working directory ("": the user's home).
	Cwd string
	// Env holds extra "KEY=VALUE" entries over the sandbox's defaults.
	Env []string
}

// ContextInfo describes a code context.
type ContextInfo struct {
	ID        string
	Language  string
	Cwd       string
	CreatedAt time.Time
	// State is "idle", "busy" or "dead" (its interpreter exited; the next
	// run restarts it).
	State string
	// IsDefault says it is its language's default context.
	IsDefault bool
	// Exit says how a dead context's interpreter ended; nil while it runs
	// or when the guest agent does not say (agents before protocol 6).
	Exit *ContextExit
}

// ContextExit is how a context's interpreter ended.
type ContextExit struct {
	// Code is the exit status, or -1 when a signal ended it.
	Code int
	// Signal is the signal that ended it, or 0.
	Signal int
	// OOMKilled says the guest's OOM killer killed it.
	OOMKilled bool
}

// Reason says how the interpreter ended, as messages put it: "out of
// memory", "killed by signal 9" or "exit code 3".
func (e *ContextExit) Reason() string {
	switch {
	case e == nil:
		return "the reason is unknown"
	case e.OOMKilled:
		return "out of memory"
	case e.Signal > 0:
		return fmt.Sprintf("killed by signal %d", e.Signal)
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

// CodeRequest asks to run code in a context.
type CodeRequest struct {
	// ContextID names the context; "" is the default context of Language.
	ContextID string
	// Language is used with an empty ContextID ("" means python).
	Language string
	Code     string
	// Timeout interrupts the code after this long (0: never); the context
	// survives.
	Timeout time.Duration
	// MaxOutputBytes caps stdout + stderr + result bytes (0: the shim's
	// cap, which is also the largest).
	MaxOutputBytes uint64
	// ReturnFiles asks for the image files (PNG, JPEG, GIF, SVG) the run
	// wrote that match these patterns (path.Match syntax, relative to the
	// context's working directory or absolute): each comes as an
	// EventResult with File set. The manager reads them; the guest agent
	// never sees the patterns.
	ReturnFiles []string
}

// CodeEventKind says which field of a CodeEvent is set.
type CodeEventKind uint8

// Code event kinds.
const (
	EventStdout CodeEventKind = iota + 1
	EventStderr
	EventResult
	EventError
	EventEnd
	// EventStatus is the host's word on the run's progress (Status), such
	// as a context that is still starting; never guest output.
	EventStatus
)

// CodeEvent is one thing that happened in a run: output, a rich result, an
// error raised by the code, or the end (always last, exactly once).
type CodeEvent struct {
	Kind CodeEventKind
	// Data is the bytes of EventStdout and EventStderr.
	Data   []byte
	Result *CodeResult // EventResult
	Error  *CodeError  // EventError
	End    *CodeEnd    // EventEnd
	Status string      // EventStatus
}

// CodeResult is a rich value: the last expression's (Main) or a display()
// output, as MIME type -> content (text types in UTF-8, images raw).
type CodeResult struct {
	Data map[string][]byte
	Main bool
	// File is the guest path of a file that CodeRequest.ReturnFiles
	// returned (guest data: escape it for a terminal); "" for the code's
	// own results.
	File string
}

// CodeError is an error the code raised.
type CodeError struct {
	Name      string
	Value     string
	Traceback []string
}

// CodeEnd ends a run.
type CodeEnd struct {
	// TimedOut says the timeout fired and the code was interrupted.
	TimedOut bool
	// Truncated says output beyond the cap was dropped.
	Truncated bool
	Duration  time.Duration
	// ExecutionCount is the interpreter's counter (python), or 0.
	ExecutionCount int32
	// ContextID is the context that ran the code.
	ContextID string
}

// Code-context limits shared by the shim (which enforces them against the
// guest) and the manager and its surfaces (which check requests before they
// leave the host).
const (
	// MaxCodeBytes caps the code of one RunCode.
	MaxCodeBytes = 1 << 20
	// MaxCodeOutputBytes is the default and the largest output cap of one
	// RunCode: stdout + stderr + result bytes.
	MaxCodeOutputBytes = 16 << 20
	// MaxResultValueBytes caps one MIME value of a CodeResult.
	MaxResultValueBytes = 8 << 20
	// MaxResultEntries caps the MIME entries of one CodeResult.
	MaxResultEntries = 16
	// MaxCodeMessageBytes caps one ContextService message from the guest
	// (and from the shim): a result with a MaxResultValueBytes image plus
	// its small text siblings.
	MaxCodeMessageBytes = MaxResultValueBytes + 1<<20
	// MaxCodeTimeout is the longest timeout of one RunCode.
	MaxCodeTimeout = 24 * time.Hour
	// MaxContextEnv caps ContextSpec.Env.
	MaxContextEnv = 256
)

// Context languages.
const (
	LangPython     = "python"
	LangJavaScript = "javascript"
	LangBash       = "bash"
)

var contextIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`) })

// ValidateContextID checks a code-context id ([a-z0-9][a-z0-9-]{0,62}).
func ValidateContextID(id string) error {
	if !contextIDRe().MatchString(id) {
		return fmt.Errorf("%w: context id must match [a-z0-9][a-z0-9-]{0,62}", errdefs.ErrInvalid)
	}
	return nil
}

// ValidateLanguage checks a context language; "" means python.
func ValidateLanguage(lang string) error {
	switch lang {
	case "", LangPython, LangJavaScript, LangBash:
		return nil
	}
	return fmt.Errorf("%w: language must be python, javascript or bash", errdefs.ErrInvalid)
}

// Validate checks a context spec on the host side; errors wrap
// errdefs.ErrInvalid.
func (req ContextSpec) Validate() error {
	if err := ValidateLanguage(req.Language); err != nil {
		return err
	}
	if id := req.ID; id != "" {
		if err := ValidateContextID(id); err != nil {
			return err
		}
	}
	if c := req.Cwd; c != "" {
		if err := validGuestPath(c); err != nil {
			return fmt.Errorf("%w: cwd: %v", errdefs.ErrInvalid, err)
		}
	}
	if len(req.Env) > MaxContextEnv {
		return fmt.Errorf("%w: at most %d environment variables", errdefs.ErrInvalid, MaxContextEnv)
	}
	for _, kv := range req.Env {
		k, v, ok := cutEnv(kv)
		if !ok || k == "" || len(k) > 256 || len(v) > 32<<10 || containsNUL(kv) {
			return fmt.Errorf("%w: env entries must be KEY=VALUE, names 1-256 bytes, values at most 32 KiB, no NUL", errdefs.ErrInvalid)
		}
	}
	return nil
}

func cutEnv(kv string) (k, v string, ok bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return "", "", false
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// validGuestPath is the host's first check of a guest path (the shim
// checks again).
func validGuestPath(p string) error {
	switch {
	case len(p) > 4096:
		return errors.New("path too long")
	case p[0] != '/':
		return errors.New("path is not absolute")
	case containsNUL(p):
		return errors.New("path contains NUL")
	}
	return nil
}

// Validate checks a code request on the host side, all but its
// ReturnFiles (which the manager reads and checks; the shim never sees
// them); errors wrap errdefs.ErrInvalid.
func (req CodeRequest) Validate() error {
	if id := req.ContextID; id != "" {
		if err := ValidateContextID(id); err != nil {
			return err
		}
	}
	if err := ValidateLanguage(req.Language); err != nil {
		return err
	}
	if len(req.Code) > MaxCodeBytes {
		return fmt.Errorf("%w: code is longer than %d bytes", errdefs.ErrInvalid, MaxCodeBytes)
	}
	if req.Timeout < 0 || req.Timeout > MaxCodeTimeout {
		return fmt.Errorf("%w: timeout must be at most 24h", errdefs.ErrInvalid)
	}
	return nil
}
