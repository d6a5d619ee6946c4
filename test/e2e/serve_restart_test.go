package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestThreat112KillDaemonDuringExec: `kill -9` of `serve` during a long exec; after
// a restart the sandbox is running, the exec's output and exit status are
// readable, and the audit trail holds its start and exit.
func TestThreat112KillDaemonDuringExec(t *testing.T) {
	e := setup(t)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "restart-test"))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", strings.Split(key, "_")[1]) })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	start := func() *exec.Cmd { return startServeAt(t, e, addr) }
	s := &apiServer{t: t, base: "http://" + addr, hc: &http.Client{Timeout: 2 * time.Minute}}

	first := start()
	code, body := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(body, &sb)
	t.Cleanup(func() { e.run(t, nil, "rm", sb.ID) })
	code, body = s.do(key, "POST", "/v1/sandboxes/"+sb.ID+"/exec",
		strings.NewReader(`{"cmd":["sh","-c","echo started; sleep 4; echo finished; exit 5"],"background":true}`))
	if code != 202 {
		t.Fatalf("background exec: %d %s", code, body)
	}
	var ex struct {
		ExecID string `json:"exec_id"`
	}
	_ = json.Unmarshal(body, &ex)

	// Kill serve while the exec runs in the guest (it sleeps 4 s).
	var state struct{ State string }
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		code, body = s.do(key, "GET", "/v1/sandboxes/"+sb.ID+"/execs/"+ex.ExecID, nil)
		return code == 200 && json.Unmarshal(body, &state) == nil && state.State == "running"
	}) {
		t.Fatalf("the background exec is not running before serve is killed: %d %s", code, body)
	}
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()

	var info struct{ State string }
	_ = json.Unmarshal([]byte(e.must(t, "inspect", sb.ID)), &info)
	if info.State != "running" {
		t.Fatalf("sandbox after killing serve: %q", info.State)
	}

	second := start()
	t.Cleanup(func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() })
	var got struct {
		State string
		Exit  *struct{ Code int }
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		code, body = s.do(key, "GET", "/v1/sandboxes/"+sb.ID+"/execs/"+ex.ExecID, nil)
		if code != 200 {
			t.Fatalf("get exec after restart: %d %s", code, body)
		}
		_ = json.Unmarshal(body, &got)
		if got.State == "exited" || time.Now().After(deadline) {
			break
		}
	}
	if got.State != "exited" || got.Exit == nil || got.Exit.Code != 5 {
		t.Fatalf("exec after restart: %s", body)
	}
	code, body = s.do(key, "GET", "/v1/sandboxes/"+sb.ID+"/execs/"+ex.ExecID+"/stream", nil)
	if code != 200 || !strings.Contains(string(body), "started") || !strings.Contains(string(body), "finished") ||
		!strings.Contains(string(body), `"type":"exit"`) {
		t.Fatalf("replayed stream: %d %s", code, body)
	}
	code, body = s.do(key, "GET", "/v1/events?sandbox="+sb.ID, nil)
	var evs struct {
		Events []struct {
			Action string
			Detail map[string]any
		}
	}
	_ = json.Unmarshal(body, &evs)
	seen := map[string]bool{}
	for _, ev := range evs.Events {
		if ev.Detail["exec_id"] == ex.ExecID {
			seen[ev.Action] = true
		}
	}
	if code != 200 || !seen["exec.start"] || !seen["exec.exit"] {
		t.Fatalf("audit trail for the exec: %d %s", code, body)
	}
}

// TestPausedSurviveRestart: paused sandboxes outlive `serve` and every
// shim (a simulated host reboot): a new `serve` lists them as paused and
// resumes each, with its memory, on the next call.
func TestPausedSurviveRestart(t *testing.T) {
	e := setup(t)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "reboot-test"))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", strings.Split(key, "_")[1]) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &apiServer{t: t, base: "http://" + addr, hc: &http.Client{Timeout: 2 * time.Minute}}
	start := func() *exec.Cmd { return startServeAt(t, e, addr) }
	first := start()
	var ids []string
	for i := range 2 {
		code, body := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
		if code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
		var sb struct{ ID string }
		_ = json.Unmarshal(body, &sb)
		ids = append(ids, sb.ID)
		t.Cleanup(func() { e.run(t, nil, "rm", sb.ID) })
		code, body = s.do(key, "POST", "/v1/sandboxes/"+sb.ID+"/code", strings.NewReader(`{"code":"n = `+strconv.Itoa(100+i)+`\nprint(n)"}`))
		if code != 200 {
			t.Fatalf("code: %d %s", code, body)
		}
		if code, body := s.do(key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", strings.NewReader(`{}`)); code != 200 {
			t.Fatalf("pause: %d %s", code, body)
		}
	}
	// The host "reboots": serve dies, and no process of the sandboxes is
	// left (paused sandboxes have none).
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	for _, id := range ids {
		if len(processesMentioning(id)) > 0 {
			t.Fatalf("a process of paused sandbox %s is still running", id)
		}
	}
	second := start()
	t.Cleanup(func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() })
	for i, id := range ids {
		code, body := s.do(key, "GET", "/v1/sandboxes/"+id, nil)
		if code != 200 || !strings.Contains(string(body), `"state":"paused"`) {
			t.Fatalf("after restart %s: %d %s", id, code, body)
		}
		code, body = s.do(key, "POST", "/v1/sandboxes/"+id+"/code", strings.NewReader(`{"code":"print(n)"}`))
		if code != 200 || !strings.Contains(string(body), strconv.Itoa(100+i)) {
			t.Fatalf("code on the paused sandbox after restart: %d %s", code, body)
		}
	}
}

// startServeAt starts `airlock serve` on addr (the caller stops it) and
// waits until it answers.
func startServeAt(t *testing.T, e env, addr string, flags ...string) *exec.Cmd {
	t.Helper()
	c := e.cmd(context.Background(), nil, append([]string{"serve", "--listen", addr}, flags...)...)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := hc.Get("http://" + addr + "/healthz"); err == nil {
			res.Body.Close()
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("serve did not come up")
		}
	}
}

// TestThreat115GracefulStopFlushes: SIGTERM to `serve` while an exec
// streams through it: the exec's response runs to its exit, serve then
// exits 0, new connections are refused once it has stopped, the audit
// trail holds the exec's start and exit, and the sandbox keeps running.
func TestThreat115GracefulStopFlushes(t *testing.T) {
	e := setup(t)
	s, srv, key, sb := servedSandbox(t, e, "graceful-test")
	addr := strings.TrimPrefix(s.base, "http://")

	type reply struct {
		code int
		body []byte
		err  error
	}
	done := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest("POST", s.base+"/v1/sandboxes/"+sb.ID+"/exec",
			strings.NewReader(`{"cmd":["sh","-c","touch /tmp/started; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished; exit 7"]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := s.hc.Do(req)
		if err != nil {
			done <- reply{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		done <- reply{res.StatusCode, b, err}
	}()
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		return e.run(t, nil, "exec", sb.ID, "--", "test", "-e", "/tmp/started").code == 0
	}) {
		t.Fatal("the exec did not start")
	}
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	// serve is draining (its listener closes first): it must not exit
	// while the exec's response is open.
	if !testutil.WaitFor(t, 20*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	}) {
		t.Fatal("serve still accepts connections after SIGTERM")
	}
	select {
	case err := <-exited:
		t.Fatalf("serve exited (%v) with an exec response in flight", err)
	case r := <-done:
		t.Fatalf("the exec's response ended before the exec did: %d %s %v", r.code, r.body, r.err)
	default:
	}
	e.must(t, "exec", sb.ID, "--", "touch", "/tmp/go")
	r := <-done
	if r.err != nil || r.code != 200 || !strings.Contains(string(r.body), "finished") || !strings.Contains(string(r.body), `"code":7`) {
		t.Fatalf("the in-flight exec through a stopping serve: %d %v %s", r.code, r.err, r.body)
	}
	if err := <-exited; err != nil {
		t.Fatalf("serve did not exit cleanly on SIGTERM: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the listener still accepts after serve stopped")
	}
	var execID string
	for l := range strings.SplitSeq(string(r.body), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["type"] == "start" {
			execID, _ = m["exec_id"].(string)
		}
	}
	seen := map[string]bool{}
	for _, ev := range events(t, e, sb.ID) {
		if ev.Detail["exec_id"] == execID {
			seen[ev.Action] = true
		}
	}
	if execID == "" || !seen["exec.start"] || !seen["exec.exit"] {
		t.Errorf("audit trail for exec %q after a graceful stop: %v", execID, seen)
	}
	var info struct{ State string }
	_ = json.Unmarshal([]byte(e.must(t, "inspect", sb.ID)), &info)
	if info.State != "running" {
		t.Errorf("sandbox after serve stopped: %q", info.State)
	}
}

// TestServeDrainCutsWithAReason: past --drain, an exec stream still open
// ends with an error line that says the exec goes on and where to
// re-attach; the exec does go on.
func TestServeDrainCutsWithAReason(t *testing.T) {
	e := setup(t)
	s, srv, key, sb := servedSandbox(t, e, "drain-test", "--drain", "1s")
	done := make(chan []byte, 1)
	go func() {
		req, _ := http.NewRequest("POST", s.base+"/v1/sandboxes/"+sb.ID+"/exec",
			strings.NewReader(`{"cmd":["sh","-c","touch /tmp/started; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done > /tmp/finished"]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := s.hc.Do(req)
		if err != nil {
			done <- []byte(err.Error())
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		done <- b
	}()
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		return e.run(t, nil, "exec", sb.ID, "--", "test", "-e", "/tmp/started").code == 0
	}) {
		t.Fatal("the exec did not start")
	}
	_ = srv.Process.Signal(syscall.SIGTERM)
	b := <-done
	if err := srv.Wait(); err != nil {
		t.Errorf("serve after a drain that cut a stream: %v", err)
	}
	var last map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		_ = json.Unmarshal([]byte(l), &last)
	}
	msg, _ := last["error"].(map[string]any)
	if last["type"] != "error" || msg["code"] != "unavailable" || !strings.Contains(fmt.Sprint(msg["message"]), "re-attach") {
		t.Fatalf("a stream cut by the drain ends with %q", b)
	}
	// The exec outlived its stream.
	e.must(t, "exec", sb.ID, "--", "touch", "/tmp/go")
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		return e.run(t, nil, "exec", sb.ID, "--", "test", "-e", "/tmp/finished").code == 0
	}) {
		t.Fatal("the exec died with its stream")
	}
}

// TestThreat124DaemonIsNotTheOOMVictim: under host memory pressure the
// kernel's OOM killer picks by oom_score_adj: serve lowers its own where
// it may, every process of a sandbox (shim, VMM or sentry) runs raised by
// 500 (half the host's memory in the killer's points), so a sandbox goes
// before the control plane. Read from /proc on the host.
func TestThreat124DaemonIsNotTheOOMVictim(t *testing.T) {
	e := setup(t)
	_, srv, _, sb := servedSandbox(t, e, "oom-test")
	t.Cleanup(func() { _ = srv.Process.Signal(syscall.SIGTERM); _ = srv.Wait() })
	adj := func(pid int) int {
		t.Helper()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// serve lowers its score where it may (CAP_SYS_RESOURCE; not on every
	// host); sandboxes are raised everywhere, well above it.
	served := adj(srv.Process.Pid)
	if served > 0 {
		t.Errorf("serve's oom_score_adj is %d", served)
	}
	pids := processesMentioning(sb.ID)
	if len(pids) < 2 {
		t.Fatalf("found %d processes of the sandbox (want its shim and VMM or sentry)", len(pids))
	}
	for _, pid := range pids {
		if a := adj(pid); a < served+300 {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("pid %d (%.60q) of the sandbox has oom_score_adj %d", pid, cmd, a)
		}
	}
}

// servedSandbox starts `serve` (with flags) on a free port, makes a key
// for tenant and creates a sandbox with it; the key and the sandbox go at
// cleanup, the caller stops serve.
func servedSandbox(t *testing.T, e env, tenant string, flags ...string) (s *apiServer, srv *exec.Cmd, key string, sb struct{ ID string }) {
	t.Helper()
	key = strings.TrimSpace(e.must(t, "keys", "create", "--tenant", tenant))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", strings.Split(key, "_")[1]) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv = startServeAt(t, e, addr, flags...)
	s = &apiServer{t: t, base: "http://" + addr, hc: &http.Client{Timeout: 2 * time.Minute}}
	code, body := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	_ = json.Unmarshal(body, &sb)
	t.Cleanup(func() { e.run(t, nil, "rm", sb.ID) })
	return s, srv, key, sb
}
