package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// socketpair returns two connected *net.UnixConn.
func socketpair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "sp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conv(fds[0]), conv(fds[1])
}

// fakeQEMU is a scripted QMP server on one end of a socketpair.
type fakeQEMU struct {
	t    *testing.T
	conn *net.UnixConn
	// handle answers one command; it returns the reply line(s) to send.
	handle func(cmd map[string]any, fds []int) []string
	done   chan struct{}
}

func startFake(t *testing.T, greeting string, handle func(cmd map[string]any, fds []int) []string) (*fakeQEMU, *net.UnixConn) {
	t.Helper()
	host, guest := socketpair(t)
	f := &fakeQEMU{t: t, conn: guest, handle: handle, done: make(chan struct{})}
	go f.serve(greeting)
	t.Cleanup(func() {
		guest.Close()
		<-f.done
	})
	return f, host
}

func (f *fakeQEMU) send(line string) {
	_, _ = io.WriteString(f.conn, line+"\r\n")
}

func (f *fakeQEMU) serve(greeting string) {
	defer close(f.done)
	if greeting != "" {
		f.send(greeting)
	}
	br := bufio.NewReader(&oobReader{f: f})
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		var cmd map[string]any
		if err := json.Unmarshal([]byte(line), &cmd); err != nil {
			f.t.Errorf("fake: bad command %q", line)
			return
		}
		fds := f.takeFDs()
		for _, r := range f.handle(cmd, fds) {
			f.send(r)
		}
	}
}

// oobReader reads the stream with recvmsg, collecting passed fds.
type oobReader struct{ f *fakeQEMU }

var (
	fdMu  sync.Mutex
	fdBuf = map[*fakeQEMU][]int{}
)

func (r *oobReader) Read(p []byte) (int, error) {
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := r.f.conn.ReadMsgUnix(p, oob)
	if oobn > 0 {
		msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				fds, _ := syscall.ParseUnixRights(&m)
				fdMu.Lock()
				fdBuf[r.f] = append(fdBuf[r.f], fds...)
				fdMu.Unlock()
			}
		}
	}
	if n < 0 {
		n = 0
	}
	return n, err
}

func (f *fakeQEMU) takeFDs() []int {
	fdMu.Lock()
	defer fdMu.Unlock()
	fds := fdBuf[f]
	delete(fdBuf, f)
	return fds
}

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7"}, "capabilities": ["oob"]}}`

func ret(cmd map[string]any, v string) string {
	id, _ := json.Marshal(cmd["id"])
	return fmt.Sprintf(`{"return": %s, "id": %s}`, v, id)
}

func basicHandler(cmd map[string]any, fds []int) []string {
	switch cmd["execute"] {
	case "qmp_capabilities":
		return []string{ret(cmd, "{}")}
	case "query-status":
		return []string{
			`{"timestamp": {"seconds": 1700000000, "microseconds": 5}, "event": "RESUME"}`,
			ret(cmd, `{"status": "running", "running": true}`),
		}
	case "echo":
		args, _ := json.Marshal(cmd["arguments"])
		return []string{ret(cmd, string(args))}
	case "hang":
		return nil
	default:
		id, _ := json.Marshal(cmd["id"])
		return []string{fmt.Sprintf(`{"error": {"class": "CommandNotFound", "desc": "The command %v has not been found"}, "id": %s}`, cmd["execute"], id)}
	}
}

func TestHandshakeAndExecute(t *testing.T) {
	_, host := startFake(t, greeting, basicHandler)
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Version().String(); got != "7.2.22 (Debian 1:7.2+dfsg-7)" {
		t.Errorf("version = %q", got)
	}
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := c.Execute(t.Context(), "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "running" || !st.Running {
		t.Errorf("status = %+v", st)
	}
	select {
	case ev := <-c.Events():
		if ev.Name != "RESUME" || ev.Time.Unix() != 1700000000 {
			t.Errorf("event = %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}

	err = c.Execute(t.Context(), "nope", nil, nil)
	qe, ok := errors.AsType[*Error](err)
	if !ok || qe.Class != "CommandNotFound" {
		t.Fatalf("err = %v, want CommandNotFound", err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	_, host := startFake(t, greeting, basicHandler)
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			var out struct{ N int }
			if err := c.Execute(t.Context(), "echo", map[string]int{"N": i}, &out); err != nil {
				t.Error(err)
				return
			}
			if out.N != i {
				t.Errorf("reply %d to call %d", out.N, i)
			}
		})
	}
	wg.Wait()
}

func TestDeadline(t *testing.T) {
	_, host := startFake(t, greeting, basicHandler)
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	if err := c.Execute(ctx, "hang", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	// The session still works after a call gave up.
	if err := c.Execute(t.Context(), "echo", map[string]int{"N": 1}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestNoGreeting(t *testing.T) {
	_, host := startFake(t, "", basicHandler)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, host); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

func TestCloseFailsPending(t *testing.T) {
	received := make(chan struct{}, 1)
	f, host := startFake(t, greeting, func(cmd map[string]any, fds []int) []string {
		if cmd["execute"] == "hang" {
			received <- struct{}{}
		}
		return basicHandler(cmd, fds)
	})
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(t.Context(), "hang", nil, nil) }()
	select {
	case <-received: // the call is pending
	case <-time.After(5 * time.Second):
		t.Fatal("the command never reached QEMU")
	}
	f.conn.Close() // QEMU exits
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending call not failed")
	}
	<-c.Done()
	if _, ok := <-c.Events(); ok {
		t.Fatal("events not closed")
	}
	if err := c.Execute(t.Context(), "echo", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestOversizedMessage(t *testing.T) {
	big := `{"event": "X", "data": "` + strings.Repeat("a", MaxMessageBytes) + `"}`
	_, host := startFake(t, greeting, func(cmd map[string]any, fds []int) []string {
		if cmd["execute"] == "qmp_capabilities" {
			return []string{ret(cmd, "{}"), big}
		}
		return nil
	})
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("oversized message did not end the session")
	}
	if err := c.Execute(t.Context(), "echo", nil, nil); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("err = %v", err)
	}
}

func TestSendFD(t *testing.T) {
	got := make(chan string, 1)
	_, host := startFake(t, greeting, func(cmd map[string]any, fds []int) []string {
		if cmd["execute"] != "getfd" {
			return basicHandler(cmd, fds)
		}
		args := cmd["arguments"].(map[string]any)
		if len(fds) != 1 {
			got <- fmt.Sprintf("%d fds", len(fds))
			return []string{ret(cmd, "{}")}
		}
		f := os.NewFile(uintptr(fds[0]), "passed")
		defer f.Close()
		b := make([]byte, 64)
		n, _ := f.ReadAt(b, 0)
		got <- args["fdname"].(string) + ":" + string(b[:n])
		return []string{ret(cmd, "{}")}
	})
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := t.TempDir() + "/state"
	if err := os.WriteFile(p, []byte("snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := c.SendFD(t.Context(), "snap", f); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "snap:snapshot" {
		t.Fatalf("fake got %q", s)
	}
}

func TestEventsDroppedWhenFull(t *testing.T) {
	_, host := startFake(t, greeting, func(cmd map[string]any, fds []int) []string {
		out := []string{}
		if cmd["execute"] == "burst" {
			for range EventBuffer + 10 {
				out = append(out, `{"event": "STOP"}`)
			}
		}
		return append(out, ret(cmd, "{}"))
	})
	c, err := Dial(t.Context(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Execute(t.Context(), "burst", nil, nil); err != nil {
		t.Fatal(err)
	}
	if d := c.DroppedEvents(); d != 10 {
		t.Fatalf("dropped = %d, want 10", d)
	}
}
