package agent

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestSplitCmdline(t *testing.T) {
	t.Parallel()
	argv, trunc := splitCmdline([]byte("ls\x00-l\x00/tmp\x00"), false)
	if !slices.Equal(argv, []string{"ls", "-l", "/tmp"}) || trunc {
		t.Errorf("got %q %v", argv, trunc)
	}
	var many []byte
	for range 100 {
		many = append(many, "a\x00"...)
	}
	argv, trunc = splitCmdline(many, false)
	if len(argv) != procMaxArgs || !trunc {
		t.Errorf("100 args: got %d, truncated %v; want %d, true", len(argv), trunc, procMaxArgs)
	}
	long := strings.Repeat("x", 3000)
	argv, trunc = splitCmdline([]byte("cmd\x00"+long+"\x00tail"), false)
	total := 0
	for _, a := range argv {
		total += len(a)
	}
	if total > procMaxArgvBytes || !trunc || len(argv) != 2 {
		t.Errorf("long arg: %d args, %d bytes, truncated %v", len(argv), total, trunc)
	}
	// Not UTF-8: made valid (a proto string must be), still bounded.
	argv, _ = splitCmdline([]byte("\xff\xfe\x00ok"), false)
	for _, a := range argv {
		if !strings.Contains(a, "ok") && !strings.Contains(a, "\uFFFD") {
			t.Errorf("invalid UTF-8 kept: %q", a)
		}
	}
	if got := procText("aé", 2); got != "a" {
		t.Errorf("procText cut a rune: %q", got)
	}
}

// connectorMsg builds one netlink message as the kernel sends it.
func connectorMsg(what uint32, body ...uint32) []byte {
	ne := binary.NativeEndian
	data := make([]byte, procEventHdrLen+4*len(body))
	ne.PutUint32(data[0:], what)
	ne.PutUint64(data[8:], 42)
	for i, v := range body {
		ne.PutUint32(data[procEventHdrLen+4*i:], v)
	}
	cn := make([]byte, cnMsgLen)
	ne.PutUint32(cn[0:], cnIdxProc)
	ne.PutUint32(cn[4:], cnValProc)
	ne.PutUint16(cn[16:], uint16(len(data)))
	msg := make([]byte, nlmsgHdrLen)
	ne.PutUint32(msg[0:], uint32(nlmsgHdrLen+cnMsgLen+len(data)))
	ne.PutUint16(msg[4:], unix.NLMSG_DONE)
	return append(append(msg, cn...), data...)
}

func TestParseProcEvents(t *testing.T) {
	t.Parallel()
	var b []byte
	b = append(b, connectorMsg(procEventExec, 10, 10)...)
	b = append(b, connectorMsg(0x1, 11, 11)...)                     // fork: skipped
	b = append(b, connectorMsg(procEventExit, 12, 12, 3<<8, 17)...) // exit 3
	b = append(b, connectorMsg(procEventExit, 13)...)               // short: skipped
	var got []rawProcEvent
	parseProcEvents(b, func(e rawProcEvent) { got = append(got, e) })
	if len(got) != 2 || got[0].what != procEventExec || got[0].tgid != 10 || got[1].tgid != 12 || got[1].exitStatus != 3<<8 || got[0].tsNano != 42 {
		t.Errorf("parsed %+v", got)
	}
	// Hostile lengths end the parse without a panic.
	bad := connectorMsg(procEventExec, 1, 1)
	binary.NativeEndian.PutUint32(bad, 1<<20)
	parseProcEvents(bad, func(rawProcEvent) { t.Error("event from a bad length") })
	parseProcEvents(bad[:5], func(rawProcEvent) { t.Error("event from a short buffer") })
}

// TestProcEventsRealProcesses runs real programs and checks that the
// stream reports their execs (program, argv, cwd, parent, uid) and exits
// (code, signal). It needs root (the connector) and sees every process of
// the machine: it looks only at its own.
func TestProcEventsRealProcesses(t *testing.T) {
	testutil.RequireRoot(t)
	env := newTestEnv(t)
	st, err := env.c.ProcEvents(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() { // the stream is live once the first message comes
		t.Fatalf("no first message: %v", st.Err())
	}
	events := make(chan *agentv1.ProcEvent, 1<<14)
	go func() {
		for st.Receive() {
			for _, e := range st.Msg().GetEvents() {
				events <- e
			}
		}
		close(events)
	}()

	dir := t.TempDir()
	sh := exec.Command("/bin/sh", "-c", "/bin/sleep 0.3; exit 3")
	sh.Dir = dir
	if err := sh.Run(); err == nil || sh.ProcessState.ExitCode() != 3 {
		t.Fatalf("sh: %v", err)
	}
	killed := exec.Command("/bin/sleep", "30")
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until its exec is reported before killing it, so that /proc
	// still holds it when the agent looks.
	shPid, killedPid := uint32(sh.Process.Pid), uint32(killed.Process.Pid)
	shExe, _ := filepath.EvalSymlinks("/bin/sh")
	sleepExe, _ := filepath.EvalSymlinks("/bin/sleep")
	var shExec, sleepExec, shExit, killedExec, killedExit *agentv1.ProcEvent
	deadline := time.After(30 * time.Second)
	for shExit == nil || sleepExec == nil || killedExit == nil {
		var e *agentv1.ProcEvent
		select {
		case e = <-events:
		case <-deadline:
			t.Fatalf("events missing: sh exec %v, sleep exec %v, sh exit %v, killed exec %v, killed exit %v", shExec, sleepExec, shExit, killedExec, killedExit)
		}
		if e == nil {
			t.Fatalf("stream ended: %v", st.Err())
		}
		switch {
		case e.GetKind() == agentv1.ProcEvent_KIND_EXEC && e.GetPid() == shPid:
			shExec = e
		case e.GetKind() == agentv1.ProcEvent_KIND_EXEC && e.GetPpid() == shPid:
			sleepExec = e
		case e.GetKind() == agentv1.ProcEvent_KIND_EXIT && e.GetPid() == shPid:
			shExit = e
		case e.GetKind() == agentv1.ProcEvent_KIND_EXEC && e.GetPid() == killedPid:
			killedExec = e
			_ = killed.Process.Signal(syscall.SIGKILL)
			_ = killed.Wait()
		case e.GetKind() == agentv1.ProcEvent_KIND_EXIT && e.GetPid() == killedPid:
			killedExit = e
		}
	}
	if shExec == nil || shExec.GetPath() != shExe || !slices.Equal(shExec.GetArgv(), []string{"/bin/sh", "-c", "/bin/sleep 0.3; exit 3"}) ||
		shExec.GetCwd() != dir || !shExec.GetAgent() || shExec.GetPpid() != uint32(os.Getpid()) || shExec.GetUid() != 0 {
		t.Errorf("sh exec: %v (want path %s, cwd %s, started by the agent)", shExec, shExe, dir)
	}
	if sleepExec.GetPath() != sleepExe || !slices.Equal(sleepExec.GetArgv(), []string{"/bin/sleep", "0.3"}) || sleepExec.GetAgent() || sleepExec.GetCwd() != dir {
		t.Errorf("sleep exec: %v", sleepExec)
	}
	if shExit.GetExitCode() != 3 || shExit.GetSignal() != 0 || shExit.GetPath() != shExe {
		t.Errorf("sh exit: %v, want code 3", shExit)
	}
	if killedExit.GetSignal() != int32(syscall.SIGKILL) || killedExit.GetPath() != sleepExe {
		t.Errorf("killed exit: %v, want signal 9", killedExit)
	}
	if d := time.Duration(shExec.GetUnixNano() - time.Now().UnixNano()); d > time.Minute || d < -time.Minute {
		t.Errorf("exec time %v off the wall clock", d)
	}
}
