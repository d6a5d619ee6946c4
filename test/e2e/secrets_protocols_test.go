package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// upstreamRecord is what a test upstream received.
type upstreamRecord struct {
	host, proto, path, auth, apiKey string
}

// recordingUpstream is a loopback TLS server offering h2 and http/1.1 that
// records each request's headers, reflects them, and answers a WebSocket
// handshake with a 101 and an echo of every byte after it.
type recordingUpstream struct {
	port string
	mu   sync.Mutex
	seen []upstreamRecord
}

func startRecordingUpstream(t *testing.T, cert tls.Certificate) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, upstreamRecord{r.Host, r.Proto, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Api-Key")})
		u.mu.Unlock()
		echo := "auth=" + r.Header.Get("Authorization") + " key=" + r.Header.Get("X-Api-Key")
		if r.Header.Get("Upgrade") == "websocket" {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\nX-Echo: %s\r\n\r\n", echo)
			if brw.Flush() == nil {
				_, _ = io.Copy(conn, brw)
			}
			return
		}
		w.Header().Set("X-Echo", echo)
		fmt.Fprintf(w, "%s %s\n", r.Proto, echo)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	u.port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	return u
}

func (u *recordingUpstream) records() []upstreamRecord {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upstreamRecord(nil), u.seen...)
}

// wsClient is a WebSocket handshake in python3 (the guest has no WebSocket
// client): it prints the status line and the X-Echo header of the answer,
// then sends bytes after the 101 and prints what comes back.
const wsClient = `
import os, socket, ssl, sys
host, port = sys.argv[1], int(sys.argv[2])
s = ssl.create_default_context().wrap_socket(socket.create_connection((host, port), timeout=20), server_hostname=host)
s.sendall(("GET /ws HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % (host, port, os.environ["API_KEY"])).encode())
head = b""
while b"\r\n\r\n" not in head:
    b = s.recv(4096)
    if not b:
        break
    head += b
head, _, rest = head.partition(b"\r\n\r\n")
lines = head.decode().split("\r\n")
print(lines[0])
for l in lines[1:]:
    if l.lower().startswith("x-echo:"):
        print(l)
msg = b"\x81\x05hello" + os.environ["API_KEY"].encode()
s.sendall(msg)
while len(rest) < len(msg):
    b = s.recv(4096)
    if not b:
        break
    rest += b
print("echo-ok" if rest == msg else "echo-bad %r" % rest)
`

// TestSecretsOverHTTP2WebSocketAndHeaderScope: curl --http2 in the guest
// gets a secret injected at its host (over HTTP/2 on both sides), a
// header-scoped secret only in its header, a WebSocket handshake gets the
// injection, and no other host, event, file or guest memory ever sees a
// value.
func TestSecretsOverHTTP2WebSocketAndHeaderScope(t *testing.T) {
	e := setup(t)
	value := "sk-e2e-H2-" + rand.Text()
	scopedValue := "sk-e2e-SCOPED-" + rand.Text()
	caPEM, cert := testCA(t, "api.test", "other.test")
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	api := startRecordingUpstream(t, cert)
	other := startRecordingUpstream(t, cert)

	dns := testutil.StartDNS(t, map[string][]string{"api.test": {pubC}, "other.test": {pubB}})
	extra := []string{
		"AIRLOCK_TEST_DIAL_MAP=" + pubC + "=127.0.0.1," + pubB + "=127.0.0.1",
		"AIRLOCK_DNS=" + dns.Addr,
		"AIRLOCK_UPSTREAM_CA_FILE=" + caFile,
		"API_KEY=" + value,
		"SCOPED_KEY=" + scopedValue,
	}
	r := e.runWith(t, extra, nil, "create", "--secret", "API_KEY@api.test", "--secret", "SCOPED_KEY@api.test:x-api-key")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	if v := e.must(t, "exec", id, "--", "curl", "-V"); !strings.Contains(v, "HTTP2") {
		t.Fatalf("the guest's curl has no HTTP/2:\n%s", v)
	}
	ph := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c", `printf %s "$API_KEY"`))
	scopedPH := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c", `printf %s "$SCOPED_KEY"`))

	// HTTP/2 to the secrets' host: both injected, each where it may go.
	base := "https://api.test:" + api.port
	out := e.run(t, nil, "exec", id, "--", "sh", "-c",
		`curl -sS --http2 -D - -w 'version=%{http_version}\n' `+base+`/h2 -H "Authorization: Bearer $API_KEY" -H "X-Api-Key: $SCOPED_KEY"`)
	if out.code != 0 || !strings.Contains(out.stdout, "version=2") {
		t.Fatalf("curl --http2: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
	}
	got := api.records()
	if len(got) != 1 || got[0].proto != "HTTP/2.0" || got[0].auth != "Bearer "+value || got[0].apiKey != scopedValue {
		t.Fatalf("upstream saw %+v, want HTTP/2.0 with both values", got)
	}
	if strings.Contains(out.stdout, value) || strings.Contains(out.stdout, scopedValue) ||
		!strings.Contains(out.stdout, "auth=Bearer "+ph+" key="+scopedPH) {
		t.Fatalf("the guest saw a reflected value, or not the placeholders:\n%s", out.stdout)
	}

	// The header-scoped secret in another header: refused, over HTTP/2.
	out = e.run(t, nil, "exec", id, "--", "sh", "-c",
		`curl -sS --http2 -o /dev/null -w '%{http_code} %{http_version}' `+base+`/bad -H "Authorization: Bearer $SCOPED_KEY"`)
	if strings.TrimSpace(out.stdout) != "403 2" {
		t.Errorf("scoped secret in Authorization: %q (exit %d, %s), want 403 over HTTP/2", out.stdout, out.code, out.stderr)
	}
	if got := api.records(); len(got) != 1 {
		t.Errorf("the refused request reached the upstream: %+v", got)
	}

	// Another host (not intercepted: the guest talks TLS to it directly,
	// hence -k) gets at most the placeholder.
	out = e.run(t, nil, "exec", id, "--", "sh", "-c",
		`curl -sS -k --http2 -o /dev/null -w '%{http_version}' https://other.test:`+other.port+`/ -H "Authorization: Bearer $API_KEY"`)
	if out.code != 0 || strings.TrimSpace(out.stdout) != "2" {
		t.Errorf("curl --http2 to the other host: exit %d %q %s", out.code, out.stdout, out.stderr)
	}
	for _, rec := range other.records() {
		if strings.Contains(rec.auth, value) || strings.Contains(rec.apiKey, scopedValue) {
			t.Errorf("the other host received a value: %+v", rec)
		}
	}

	// A WebSocket handshake gets the injection; bytes after the 101 are
	// relayed as they are.
	out = e.run(t, strings.NewReader(wsClient), "exec", "-i", id, "--", "python3", "-", "api.test", api.port)
	if out.code != 0 || !strings.Contains(out.stdout, "101") || !strings.Contains(out.stdout, "echo-ok") ||
		!strings.Contains(out.stdout, "X-Echo: auth=Bearer "+ph) || strings.Contains(out.stdout, value) {
		t.Fatalf("websocket: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
	}
	got = api.records()
	if n := len(got); n != 2 || got[1].path != "/ws" || got[1].auth != "Bearer "+value || got[1].proto != "HTTP/1.1" {
		t.Fatalf("upstream saw %+v, want the handshake with the value", got)
	}

	// The values are nowhere but on the host: not in the guest's memory,
	// the audit trail or the state dir.
	vmm := vmmPID(t, id)
	for _, v := range []string{value, scopedValue} {
		if processMemoryContains(t, vmm, []byte(v)) {
			t.Error("a secret value is in the VMM's memory")
		}
	}
	if !processMemoryContains(t, vmm, []byte(scopedPH)) {
		t.Error("control: the placeholder (in the guest's env) was not found in the VMM's memory, so the scan proves nothing")
	}
	evs := events(t, e, id)
	b, _ := json.Marshal(evs)
	if bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte(scopedValue)) {
		t.Error("the audit trail holds a secret value")
	}
	if !hasEvent(evs, "net.secret.inject", "") || !hasEvent(evs, "net.secret.block", "") {
		t.Errorf("audit trail lacks inject/block events:\n%s", dumpEvents(evs))
	}
	for _, v := range []string{value, scopedValue} {
		if p := fileContaining(t, e.state, []byte(v)); p != "" {
			t.Errorf("state dir file %s contains a secret value", p)
		}
	}
}
