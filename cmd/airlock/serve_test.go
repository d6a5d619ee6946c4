package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	spec "github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// (mode 0600) under dir and returns their paths and the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "airlock test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// testServe is serve's server over a fresh state dir, run by serveAPI.
type testServe struct {
	s      *api.Server
	addr   string
	logs   *testutil.Buffer // the server's log (text)
	access *testutil.Buffer // the access log (text)
	out    *testutil.Buffer // stdout
	stop   context.CancelCauseFunc
	done   chan error
}

func startServe(t *testing.T, tlsConf *tls.Config, drain time.Duration, blocking http.Handler) *testServe {
	t.Helper()
	ts := &testServe{logs: &testutil.Buffer{}, access: &testutil.Buffer{}, out: &testutil.Buffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(ts.logs, nil))
	g := &globals{stateDir: t.TempDir(), accel: "auto", runtime: "qemu", hostCgroups: "auto", logLevel: "info", log: log}
	m, closeStore, err := g.manager(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	s, closeMCP, err := newAPIServer(t.Context(), g, m, "", slog.New(slog.NewTextHandler(ts.access, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if blocking != nil {
		s.HandlePublic("GET /test/block", blocking)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.s, ts.addr = s, ln.Addr().String()
	ctx, stop := context.WithCancelCause(context.Background())
	ts.stop = stop
	go func() { ts.done <- serveAPI(ctx, s, ln, tlsConf, drain, closeMCP, ts.out, log) }()
	t.Cleanup(func() {
		stop(errors.New("test over"))
		if err := <-ts.done; err != nil {
			t.Logf("serveAPI at cleanup: %v", err)
		}
	})
	return ts
}

// stopServe stops the server as a signal would and returns serveAPI's
// error.
func (ts *testServe) stopServe(t *testing.T) error {
	t.Helper()
	ts.stop(errors.New("terminated signal received"))
	select {
	case err := <-ts.done:
		ts.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		t.Fatalf("serveAPI did not return after its stop; log:\n%s", ts.logs.String())
		return nil
	}
}

// TestServeTLS: with a certificate the API is served over HTTPS, HTTP/2
// included, to a client that trusts it, and to no other; the spec is at
// /v1/openapi.yaml; each request has an access log line; a stop with a
// request in flight past the drain cuts it and says so.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir)
	log := slog.New(slog.DiscardHandler)

	// A key every user may read is refused.
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadTLS(certFile, keyFile, log); err == nil || !strings.Contains(err.Error(), "read by every user") {
		t.Errorf("world-readable key: %v", err)
	}
	if err := os.Chmod(keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadTLS(keyFile, keyFile, log); err == nil {
		t.Error("a key file as the certificate was accepted")
	}
	tlsConf, err := loadTLS(certFile, keyFile, log)
	if err != nil {
		t.Fatal(err)
	}

	started := make(chan struct{})
	block := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // until the drain is over and the server cuts it
	})
	ts := startServe(t, tlsConf, 300*time.Millisecond, block)
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(ts.out.String(), "listening") }) {
		t.Fatalf("no listening line: %q", ts.out.String())
	}
	if want := "airlock API listening on https://" + ts.addr + "\n"; ts.out.String() != want {
		t.Errorf("stdout %q, want %q", ts.out.String(), want)
	}

	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(path string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), "GET", "https://"+ts.addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res, b
	}
	res, _ := get("/healthz")
	if res.StatusCode != 200 || res.ProtoMajor != 2 {
		t.Errorf("GET /healthz over TLS: %d %s, want 200 over HTTP/2", res.StatusCode, res.Proto)
	}
	res, body := get("/v1/openapi.yaml")
	if res.StatusCode != 200 || string(body) != spec.OpenAPI() {
		t.Errorf("GET /v1/openapi.yaml: %d, %d bytes", res.StatusCode, len(body))
	}

	// A client that does not trust the certificate gets no answer; plain
	// HTTP gets no API.
	untrusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}
	t.Cleanup(untrusting.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://"+ts.addr+"/healthz", nil)
	if res, err := untrusting.Do(req); err == nil {
		res.Body.Close()
		t.Error("a client that does not trust the certificate was served")
	} else if !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("untrusting client: %v, want a certificate verification error", err)
	}
	plain := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(plain.CloseIdleConnections)
	req, _ = http.NewRequestWithContext(t.Context(), "GET", "http://"+ts.addr+"/healthz", nil)
	if res, err := plain.Do(req); err == nil {
		res.Body.Close()
		if res.StatusCode == 200 {
			t.Error("plain HTTP was served the API")
		}
	}

	// A request the drain does not see end: cut, and the stop says so.
	reqDone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "https://"+ts.addr+"/test/block", nil)
		res, err := client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		reqDone <- err
	}()
	<-started
	if n := ts.s.InFlight(); n != 1 {
		t.Fatalf("in flight: %d, want 1", n)
	}
	if err := ts.stopServe(t); err != nil {
		t.Fatalf("serveAPI: %v", err)
	}
	if err := <-reqDone; err != nil {
		t.Logf("the cut request: %v", err) // an error or a short body: either is a cut
	}
	logs := ts.logs.String()
	for _, want := range []string{
		`level=INFO msg=serving addr=` + ts.addr + ` tls=true`,
		`level=INFO msg="shutting down" cause="terminated signal received" in_flight=1 drain=300ms`,
		`level=WARN msg="drain time is up: cutting the requests still in flight" in_flight=1 drain=300ms`,
		`cut=true cut_requests=1`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
	if !strings.Contains(logs, "msg=stopped took=") {
		t.Errorf("no stopped line:\n%s", logs)
	}
	access := ts.access.String()
	for _, want := range []string{
		`msg=request method=GET path=/healthz status=200 bytes=12 `,
		`msg=request method=GET path=/v1/openapi.yaml status=200 bytes=` + strconv.Itoa(len(spec.OpenAPI())) + " ",
		`msg=request method=GET path=/test/block status=200 bytes=0 `,
	} {
		if !strings.Contains(access, want) {
			t.Errorf("the access log lacks %q:\n%s", want, access)
		}
	}
}

// TestServeStopIdle: a stop with nothing in flight cuts nothing, and plain
// HTTP is served without TLS.
func TestServeStopIdle(t *testing.T) {
	t.Parallel()
	ts := startServe(t, nil, 10*time.Second, nil)
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(ts.out.String(), "listening") }) {
		t.Fatalf("no listening line: %q", ts.out.String())
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://"+ts.addr+"/healthz", nil)
	client := &http.Client{Transport: &http.Transport{}}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	client.CloseIdleConnections()
	if res.StatusCode != 200 {
		t.Fatalf("GET /healthz: %d", res.StatusCode)
	}
	if err := ts.stopServe(t); err != nil {
		t.Fatalf("serveAPI: %v", err)
	}
	logs := ts.logs.String()
	for _, want := range []string{`msg="shutting down" cause="terminated signal received" in_flight=0 drain=10s`, "cut=false cut_requests=0"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "drain time is up") {
		t.Errorf("an idle stop cut requests:\n%s", logs)
	}
}
