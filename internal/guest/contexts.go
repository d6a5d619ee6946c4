package guest

import (
	"fmt"
	"time"
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
