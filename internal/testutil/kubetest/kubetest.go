// Package kubetest starts a real Kubernetes control plane for tests: etcd
// and kube-apiserver on loopback, with no kubelet, scheduler or controller
// manager (what controller-runtime's envtest runs). It is the kube tier of
// docs/TESTING.md, for airlock's cluster feature: nodes register Leases,
// controllers reconcile custom resources, and both need the real API
// server's validation, RBAC, admission, watches and resource versions.
//
// The binaries are built from the Go module proxy by scripts/kube-bins.sh,
// once per version (pinned in tools/kube/apiserver/go.mod and
// tools/kube/etcd/go.mod), into .cache/tools/kube-<version>-etcd-<version>.
// Run the tier with
//
//	make test-kube
//
// which builds them (about 5 minutes the first time) and runs the tests
// with AIRLOCK_TEST_KUBE_BIN set to that directory. Without the variable,
// Start skips the test, so a plain `go test ./...` neither fails nor
// builds Kubernetes; with it, missing binaries fail the test.
//
// Each Start gets its own etcd and kube-apiserver (a few seconds to become
// ready), stopped when the test ends; their logs are in the test's temp
// dir and their last lines in any failure message of Start.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// EnvBin names the directory with the kube-apiserver and etcd binaries
// (scripts/kube-bins.sh prints it; make test-kube sets it).
const EnvBin = "AIRLOCK_TEST_KUBE_BIN"

const (
	// readyTimeout bounds the wait for /readyz. On a busy 2-core machine
	// kube-apiserver is ready in about 5 s; the rest is headroom.
	readyTimeout = 60 * time.Second
	// stopGrace is how long a process has to exit after SIGTERM before it
	// is killed. kube-apiserver's graceful shutdown can take a minute;
	// nothing of a test's control plane outlives the test.
	stopGrace = 5 * time.Second
	// startAttempts: a free port picked by listening and closing can be
	// taken by someone else before etcd or kube-apiserver binds it; the
	// start is then retried with new ports.
	startAttempts = 3
)

// ControlPlane is a running etcd and kube-apiserver, stopped by the test's
// cleanup.
type ControlPlane struct {
	// Config authenticates with an admin bearer token (group
	// system:masters, which RBAC lets do anything) and verifies the API
	// server's self-signed certificate. Copy it (rest.CopyConfig) before
	// changing it.
	Config *rest.Config
	// URL is the API server's base URL, https://127.0.0.1:PORT.
	URL string
	// EtcdURL is etcd's client URL, http://127.0.0.1:PORT.
	EtcdURL string
	// Dir holds the logs (etcd.log, kube-apiserver.log), the etcd data,
	// the certificates and the token file.
	Dir string

	etcd, apiserver *process
}

// Start starts etcd and kube-apiserver and waits until the API server is
// ready. It skips t when AIRLOCK_TEST_KUBE_BIN is unset and fails it when
// the binaries there are missing or the control plane does not come up.
func Start(t testing.TB) *ControlPlane {
	t.Helper()
	bin := binDir(t)
	base := t.TempDir()
	var cp *ControlPlane
	// Registered before anything starts, so that a Fatal half way still
	// stops what did start; the API server goes first, then its storage.
	t.Cleanup(func() {
		if cp == nil {
			return
		}
		if t.Failed() && cp.apiserver != nil {
			t.Logf("kube-apiserver log (%s), last lines:\n%s", cp.apiserver.log, tail(cp.apiserver.log))
		}
		begin := time.Now()
		cp.apiserver.stop()
		cp.etcd.stop()
		t.Logf("kubetest: control plane stopped in %v", time.Since(begin).Round(time.Millisecond))
	})
	begin := time.Now()
	for attempt := 1; ; attempt++ {
		dir := base
		if attempt > 1 {
			dir = filepath.Join(base, "attempt"+strconv.Itoa(attempt))
		}
		var err error
		cp, err = start(t, bin, dir)
		if err == nil {
			t.Logf("kubetest: kube-apiserver at %s ready in %v (logs in %s)", cp.URL, time.Since(begin).Round(time.Millisecond), dir)
			return cp
		}
		if cp != nil {
			cp.apiserver.stop()
			cp.etcd.stop()
			cp = nil
		}
		if errors.Is(err, errAddrInUse) && attempt < startAttempts {
			t.Logf("kubetest: retrying with new ports: %v", err)
			continue
		}
		t.Fatalf("kubetest: %v", err)
	}
}

var errAddrInUse = errors.New("port taken")

func binDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(EnvBin)
	if dir == "" {
		t.Skip("kube tier: set " + EnvBin + " to a directory with kube-apiserver and etcd (make test-kube builds them and sets it)")
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err == nil && (fi.IsDir() || fi.Mode()&0o111 == 0) {
			err = errors.New("not an executable file")
		}
		if err != nil {
			t.Fatalf("%s=%s but there is no %s there (%v): build it with scripts/kube-bins.sh, or run make test-kube", EnvBin, dir, name, err)
		}
	}
	return dir
}

// start runs one attempt. On an error the returned ControlPlane, if not
// nil, has processes the caller must stop.
func start(t testing.TB, bin, dir string) (*ControlPlane, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	cp := &ControlPlane{
		Dir:     dir,
		EtcdURL: "http://127.0.0.1:" + strconv.Itoa(etcdClient),
		URL:     "https://127.0.0.1:" + strconv.Itoa(apiPort),
	}
	certDir := filepath.Join(dir, "certs")
	for _, d := range []string{filepath.Join(dir, "etcd"), certDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	token, err := writeCredentials(dir)
	if err != nil {
		return nil, err
	}

	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	cp.etcd, err = startProcess(filepath.Join(bin, "etcd"), filepath.Join(dir, "etcd.log"),
		"--name=kubetest",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+cp.EtcdURL,
		"--advertise-client-urls="+cp.EtcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		// The data is thrown away with the test.
		"--unsafe-no-fsync",
		// Its info lines would push what went wrong out of the tail.
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}
	if err := cp.waitEtcd(t); err != nil {
		return cp, err
	}

	cp.apiserver, err = startProcess(filepath.Join(bin, "kube-apiserver"), filepath.Join(dir, "kube-apiserver.log"),
		"--etcd-servers="+cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		// Without it the API server looks for the address of a host
		// interface (and fails where there is none).
		"--advertise-address=127.0.0.1",
		// Nothing runs the kubernetes service's endpoints; the reconciler
		// would try to publish the loopback address, which Endpoints
		// refuse.
		"--endpoint-reconciler-type=none",
		// No --tls-cert-file: it writes a self-signed CA and serving
		// certificate (127.0.0.1 among the names) here.
		"--cert-dir="+certDir,
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		// As clusters that run host agents allow (the nodes' DaemonSet
		// is privileged); kube-apiserver's own default refuses it.
		"--allow-privileged=true",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
	)
	if err != nil {
		return cp, err
	}
	if err := cp.waitReady(t, token, filepath.Join(certDir, "apiserver.crt")); err != nil {
		return cp, err
	}
	return cp, nil
}

// freePorts picks n distinct free loopback ports, all held open until all
// are picked.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeCredentials writes the admin token file (a random token in
// system:masters) and the service-account signing key pair, and returns
// the token.
func writeCredentials(dir string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	// token,user,uid,"group1,group2"
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return "", err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	priv, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return "", err
	}
	return token, nil
}

// waitEtcd waits until etcd answers /health, so that a port conflict shows
// up as etcd's own failure rather than as an API server that never gets
// ready.
func (cp *ControlPlane) waitEtcd(t testing.TB) error {
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	return cp.poll(t, func(ctx context.Context) bool {
		return getOK(ctx, client, cp.EtcdURL+"/health", &last)
	}, "etcd /health", &last)
}

// waitReady waits for the API server's self-signed certificate, builds
// Config from it, then waits until /readyz answers ok.
func (cp *ControlPlane) waitReady(t testing.TB, token, certFile string) error {
	var client *http.Client
	var last string
	return cp.poll(t, func(ctx context.Context) bool {
		if client == nil {
			ca, err := readCA(certFile)
			if err != nil {
				last = err.Error()
				return false
			}
			cp.Config = &rest.Config{
				Host:            cp.URL,
				BearerToken:     token,
				TLSClientConfig: rest.TLSClientConfig{CAData: ca},
				// client-go's default (5 per second, bursts of 10) makes
				// a busy test wait on its own client.
				QPS:   100,
				Burst: 200,
			}
			c, err := rest.HTTPClientFor(cp.Config)
			if err != nil {
				last = err.Error()
				return false
			}
			c.Timeout = 5 * time.Second
			client = c
		}
		return getOK(ctx, client, cp.URL+"/readyz", &last)
	}, "kube-apiserver /readyz", &last)
}

// getOK reports whether a GET of url answers 200; last gets what it
// answered (the status and the start of the body) or the error.
func getOK(ctx context.Context, client *http.Client, url string, last *string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		*last = err.Error()
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		*last = err.Error()
		return false
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
	*last = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(body))
	return resp.StatusCode == http.StatusOK
}

// readCA reads the bundle kube-apiserver writes for its self-signed
// serving certificate (the certificate, then the CA that signed it) and
// returns it once it is complete: every block a certificate, the last one
// a CA.
func readCA(certFile string) ([]byte, error) {
	b, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	var last *x509.Certificate
	for rest := b; len(bytes.TrimSpace(rest)) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: not (yet) a complete PEM certificate bundle", certFile)
		}
		if last, err = x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", certFile, err)
		}
	}
	if last == nil || !last.IsCA {
		return nil, fmt.Errorf("%s: no CA certificate (yet)", certFile)
	}
	return b, nil
}

// poll calls cond every 100 ms until it holds, either process exits, the
// test ends or readyTimeout passes; what is an error then names what and
// says what cond saw last, with both logs' last lines.
func (cp *ControlPlane) poll(t testing.TB, cond func(context.Context) bool, what string, last *string) error {
	ctx, cancel := context.WithTimeout(t.Context(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond(ctx) {
			return nil
		}
		select {
		case <-cp.etcd.exit():
			return cp.exited(cp.etcd)
		case <-cp.apiserver.exit():
			return cp.exited(cp.apiserver)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v (last: %s)%s", what, readyTimeout, *last, cp.logs(cp.apiserver))
		case <-tick.C:
		}
	}
}

func (cp *ControlPlane) exited(p *process) error {
	err := fmt.Errorf("%s exited early: %v%s", p.name, p.err, cp.logs(p))
	if b, _ := os.ReadFile(p.log); bytes.Contains(b, []byte("address already in use")) {
		return fmt.Errorf("%w: %w", errAddrInUse, err)
	}
	return err
}

// logs returns the last lines of the started processes' logs, first's
// first.
func (cp *ControlPlane) logs(first *process) string {
	var s strings.Builder
	for i, p := range []*process{first, cp.etcd, cp.apiserver} {
		if p == nil || (i > 0 && p == first) {
			continue
		}
		fmt.Fprintf(&s, "\n--- %s, last lines of %s:\n%s", p.name, p.log, tail(p.log))
	}
	return s.String()
}

// tail returns about the last 30 lines of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	b = bytes.TrimRight(b, "\n")
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// process is a child whose output goes to a log file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited; err is then set
	err  error
}

func startProcess(path, log string, args ...string) (*process, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	p := &process{name: filepath.Base(path), log: log, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// Should the test binary die without its cleanups (a -timeout
	// panic), the kernel kills the child. Pdeathsig follows the thread
	// that started the child, and Go keeps its threads but for those a
	// goroutine locked and left locked.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after stopGrace, and waits until the
// process has exited.
func (p *process) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exit is closed when p has exited; nil (never ready) for a process that
// was not started.
func (p *process) exit() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.done
}
