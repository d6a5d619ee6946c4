package monitor

import (
	"bytes"
	"encoding/json"
	"testing"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/fd"
	"gvisor.dev/gvisor/pkg/sentry/seccheck"
	_ "gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote" // registers the "remote" sink
)

// TestInitConfigIsTheSentrys: the trace session InitConfig writes is one
// this gVisor accepts: runsc's loader decodes it strictly, and the
// Sentry's seccheck.Create checks every point, field and sink option
// against what it registers (runsc would only log a warning).
func TestInitConfigIsTheSentrys(t *testing.T) {
	seccheck.Initialize() // as runsc's boot does
	b, err := InitConfig("/x/sink.sock")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		TraceSession seccheck.SessionConfig `json:"trace_session"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	for i := range c.TraceSession.Sinks {
		c.TraceSession.Sinks[i].FD = fd.New(fds[0])
	}
	if err := seccheck.Create(&c.TraceSession, false); err != nil {
		t.Fatalf("the Sentry refuses the session: %v\n%s", err, b)
	}
	if err := seccheck.Delete(c.TraceSession.Name); err != nil {
		t.Error(err)
	}
}
