package guest

import "time"

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
	// State is "idle", "busy" or "dead" (its interpreter exited).
	State string
	// IsDefault says it is its language's default context.
	IsDefault bool
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
}

// CodeResult is a rich value: the last expression's (Main) or a display()
// output, as MIME type -> content (text types in UTF-8, images raw).
type CodeResult struct {
	Data map[string][]byte
	Main bool
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
