package secrets

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Audit event actions.
const (
	ActionInject = "net.secret.inject" // a request was forwarded with values injected
	ActionBlock  = "net.secret.block"  // a handshake or request was refused
	ActionError  = "net.secret.error"  // a TLS or upstream failure
)

// Defaults for the Interceptor's limits.
const (
	DefaultMaxHeaderBytes = 64 << 10
	DefaultIdleTimeout    = 60 * time.Second
	// DefaultHandshakeTimeout bounds both TLS handshakes of a connection
	// together. A guest under QEMU without KVM is slow: Chromium's side of
	// the handshake took over 10 s there (TestBrowser), so the bound is
	// the idle timeout's; max_conns bounds what slow handshakes can hold.
	DefaultHandshakeTimeout = 60 * time.Second
	DefaultUpstreamTimeout  = 10 * time.Minute

	// maxBufferedBody is the largest body with a known length that is read
	// whole before forwarding: a request body so that a placeholder in it
	// stops the request before the upstream sees any of it, a response body
	// so that its scrubbed length can be sent as Content-Length. Larger
	// bodies are streamed.
	maxBufferedBody = 1 << 20
	maxAuditPath    = 200
	placeholderHex  = 32
)

const placeholderPrefix = "airlock-secret-"

// ErrRefused is wrapped by the error [Interceptor.Serve] returns when it
// refused a handshake or a request.
var ErrRefused = errors.New("refused")

// Binding is one secret as the interceptor needs it.
type Binding struct {
	Name        string   // env var name, for audit events
	Hosts       []string // "api.example.com" or "*.example.com" (normalised lower-case ASCII, no trailing dot)
	Placeholder string   // "airlock-secret-" + 32 lowercase hex
	Value       string   // the real value; never logged
	// Header, if not "", is the one request header field (matched
	// case-insensitively) the value may be put in; the placeholder
	// anywhere else in a request to Hosts is refused.
	Header string
}

// Event is one audit record. It never carries a secret's value.
type Event struct {
	Action  string   // ActionInject, ActionBlock or ActionError
	Host    string   // the SNI host name ("" if the hello had none)
	Secrets []string // names of the secrets injected, or the one whose placeholder was blocked
	Method  string   // the request's method, if a request was read
	Path    string   // its path, without the query, at most 200 bytes
	Reason  string   // why it was blocked or failed
}

// Interceptor terminates TLS for hosts that have secrets, injects the
// secrets' values into requests and forwards them to the real upstream. See
// the package documentation for what it guarantees and refuses.
//
// Its fields must not change once Serve has been called; Serve may then be
// called concurrently for many flows.
type Interceptor struct {
	CA      *CA
	Secrets []Binding
	RootCAs *x509.CertPool // verifies upstream certificates; nil means the system pool
	Audit   func(Event)    // synchronous, must not block; may be nil
	Logger  *slog.Logger   // nil: discard

	// MaxHeaderBytes bounds a request head (HTTP/2: its header list);
	// zero means DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// IdleTimeout is the longest wait for any guest read or write over
	// HTTP/1.1; over HTTP/2, for any guest write, for a frame before the
	// guest is pinged, and with no stream open before the connection is
	// closed. Zero means DefaultIdleTimeout.
	IdleTimeout      time.Duration
	HandshakeTimeout time.Duration // both TLS handshakes together; zero means DefaultHandshakeTimeout
	// UpstreamTimeout is the longest wait for any upstream read or write,
	// and for bytes in either direction of a WebSocket after its 101.
	// Zero means DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
}

// Flow is one guest TCP connection handed to [Interceptor.Serve].
type Flow struct {
	Guest    net.Conn // the guest's side; its first bytes are the TLS ClientHello
	Upstream net.Conn // an already-connected TCP conn to the real destination

	// CheckSNI is called with the ClientHello's server name (normalised)
	// before any certificate is presented; a non-nil error aborts the
	// handshake and is audited. Policy and DNS-pin checks live there. An
	// empty SNI is refused before CheckSNI is called. May be nil.
	CheckSNI func(sni string) error
}

// Serve runs one intercepted connection until either side closes, ctx ends,
// or a request is refused. It closes both f.Guest and f.Upstream before it
// returns. It returns nil when the guest closed the connection between
// requests (or idled out), an error wrapping [ErrRefused] after a refusal,
// and another error for TLS, I/O and upstream failures. Errors never contain
// a secret's value.
func (ic *Interceptor) Serve(ctx context.Context, f Flow) error {
	defer f.Guest.Close()
	defer f.Upstream.Close()
	if err := ic.validate(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		f.Guest.Close()
		f.Upstream.Close()
	})
	defer stop()
	s := &session{ic: ic, log: ic.logger()}
	err := s.run(ctx, f)
	if err != nil {
		if msg := err.Error(); s.scrubber().contains(msg) {
			err = errors.New(s.scrubber().String(msg)) // upstream bytes echoed a value
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		s.log.Debug("secrets: connection ended", "host", s.host, "err", err)
	}
	return err
}

// validate checks the configuration; errors name secrets, never values.
func (ic *Interceptor) validate() error {
	if ic.CA == nil {
		return errors.New("secrets interceptor: no CA")
	}
	for _, b := range ic.Secrets {
		if !validPlaceholder(b.Placeholder) {
			return fmt.Errorf("secrets interceptor: secret %s: malformed placeholder", b.Name)
		}
		if b.Value == "" || strings.ContainsFunc(b.Value, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return fmt.Errorf("secrets interceptor: secret %s: value is empty or has control characters", b.Name)
		}
		for _, h := range b.Hosts {
			if !validPattern(h) {
				return fmt.Errorf("secrets interceptor: secret %s: invalid host pattern %q", b.Name, h)
			}
		}
		if b.Header != "" && !ValidScopeHeader(b.Header) {
			return fmt.Errorf("secrets interceptor: secret %s: header %q cannot carry a secret", b.Name, b.Header)
		}
	}
	return nil
}

// ValidScopeHeader reports whether name can scope a secret
// ([Binding.Header]): a header field name (an RFC 9110 token) starting
// with a letter, other than the fields that frame or route a request (Host, Content-Length,
// Transfer-Encoding, TE, Trailer, Connection, Keep-Alive,
// Proxy-Connection, Upgrade, HTTP2-Settings).
func ValidScopeHeader(name string) bool {
	if !isToken(name) || !('a' <= name[0]|0x20 && name[0]|0x20 <= 'z') {
		return false
	}
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "te", "trailer", "connection",
		"keep-alive", "proxy-connection", "upgrade", "http2-settings":
		return false
	}
	return true
}

// validPlaceholder reports whether p is "airlock-secret-" + 32 lower-case hex.
func validPlaceholder(p string) bool {
	hexPart, ok := strings.CutPrefix(p, placeholderPrefix)
	return ok && len(hexPart) == placeholderHex && strings.Trim(hexPart, "0123456789abcdef") == ""
}

func (ic *Interceptor) logger() *slog.Logger {
	if ic.Logger != nil {
		return ic.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// session is the state of one Serve call.
type session struct {
	ic       *Interceptor
	log      *slog.Logger
	host     string            // normalised SNI
	inject   injector          // secrets bound to host
	names    map[string]string // placeholder -> secret name, for every secret
	foreign  map[string]bool   // placeholders of secrets not bound to host
	scanner  *Scanner          // placeholders of secrets not bound to host
	bodyScan *Scanner          // those, and the placeholders of bound header-scoped secrets
	scoped   []scopedSecret    // bound header-scoped secrets
	h2       bool              // both sides negotiated HTTP/2

	mu     sync.Mutex
	scrub  *replacer // value rules, and the credentials built so far (at most maxCredentials)
	ncreds int
	failed error // HTTP/2: the first refusal or upstream failure, returned by Serve

	guestConn *deadlineConn
	guest     *tls.Conn
	gr        *bufio.Reader
	gw        *bufio.Writer
	upstream  *tls.Conn
	ur        *bufio.Reader
	uw        *bufio.Writer
}

func (s *session) emit(ev Event) {
	if ev.Host == "" {
		ev.Host = s.host
	}
	if s.ic.Audit != nil {
		s.ic.Audit(ev)
	}
}

// run does the handshakes, then serves requests.
func (s *session) run(ctx context.Context, f Flow) error {
	ic := s.ic
	s.scrub = newReplacerRules(valueRules(ic.Secrets))

	idle := orDefault(ic.IdleTimeout, DefaultIdleTimeout)
	guestConn := &deadlineConn{Conn: f.Guest, read: idle, write: idle}
	s.guestConn = guestConn
	upTimeout := orDefault(ic.UpstreamTimeout, DefaultUpstreamTimeout)
	upConn := &deadlineConn{Conn: f.Upstream, read: upTimeout, write: upTimeout}
	hctx, cancel := context.WithTimeout(ctx, orDefault(ic.HandshakeTimeout, DefaultHandshakeTimeout))
	defer cancel()

	var blocked *Event // a refusal decided inside the handshake
	start := time.Now()
	var helloAt, upstreamTook time.Duration // when the ClientHello was read; the upstream's handshake
	leafConfig := func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		helloAt = time.Since(start)
		name := normalizeHost(hello.ServerName)
		s.host = name
		block := func(reason string) error {
			blocked = &Event{Action: ActionBlock, Reason: reason}
			return fmt.Errorf("%w: %s", ErrRefused, reason)
		}
		if name == "" {
			return nil, block("client hello has no server name")
		}
		if !validDNSName(name) {
			return nil, block("server name is not a valid host name")
		}
		s.bind()
		if len(s.inject.bound) == 0 {
			return nil, block("no secret is bound to this host")
		}
		if f.CheckSNI != nil {
			if err := f.CheckSNI(name); err != nil {
				return nil, block("server name check: " + err.Error())
			}
		}
		leaf, err := ic.CA.Leaf(name)
		if err != nil {
			return nil, err
		}
		// Reach the real upstream before completing the guest's handshake:
		// a guest never gets our certificate for a host we cannot verify.
		// HTTP/2 is offered upstream only when the guest offers it, and
		// the guest gets it only when the upstream chose it: each side
		// speaks the same version, so a guest's streams map one to one
		// onto upstream streams of the one upstream connection.
		protos := []string{"http/1.1"}
		if slices.Contains(hello.SupportedProtos, "h2") {
			protos = []string{"h2", "http/1.1"}
		}
		s.upstream = tls.Client(upConn, &tls.Config{
			ServerName: name,
			RootCAs:    ic.RootCAs,
			MinVersion: tls.VersionTLS12,
			NextProtos: protos,
		})
		upStart := time.Now()
		err = s.upstream.HandshakeContext(hctx)
		upstreamTook = time.Since(upStart)
		if err != nil {
			return nil, fmt.Errorf("upstream tls handshake: %w", err)
		}
		guestProtos := []string{"http/1.1"}
		switch p := s.upstream.ConnectionState().NegotiatedProtocol; p {
		case "", "http/1.1":
		case "h2":
			s.h2, guestProtos = true, []string{"h2"}
		default:
			return nil, fmt.Errorf("upstream negotiated %q, not h2 or http/1.1", p)
		}
		return &tls.Config{
			Certificates:           []tls.Certificate{*leaf},
			SessionTicketsDisabled: true, // every connection gets a full handshake and its own checks
			MinVersion:             tls.VersionTLS12,
			NextProtos:             guestProtos,
		}, nil
	}
	s.guest = tls.Server(guestConn, &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: leafConfig})
	if err := s.guest.HandshakeContext(hctx); err != nil {
		if blocked != nil {
			s.emit(*blocked)
			return fmt.Errorf("guest tls handshake: %w: %s", ErrRefused, blocked.Reason)
		}
		// How long each part took tells a guest that gave up (EOF: a
		// client's own handshake timeout, often a slow emulated guest)
		// from a slow upstream.
		after := time.Since(start).Round(time.Millisecond)
		took := fmt.Sprintf(" (after %s; no ClientHello)", after)
		if helloAt > 0 {
			took = fmt.Sprintf(" (after %s; the ClientHello at %s, the upstream's handshake %s)",
				after, helloAt.Round(time.Millisecond), upstreamTook.Round(time.Millisecond))
		}
		s.emit(Event{Action: ActionError, Reason: s.scrubber().String("tls handshake: " + err.Error() + took)})
		return fmt.Errorf("tls handshake: %w%s", err, took)
	}
	cancel()
	if s.h2 {
		if p := s.guest.ConnectionState().NegotiatedProtocol; p != "h2" {
			return fmt.Errorf("guest negotiated %q, but the upstream speaks h2", p)
		}
		return s.serveH2(ctx)
	}

	maxHead := orDefault(ic.MaxHeaderBytes, DefaultMaxHeaderBytes)
	s.gr = bufio.NewReaderSize(s.guest, maxHead)
	s.gw = bufio.NewWriterSize(s.guest, 16<<10)
	s.ur = bufio.NewReaderSize(s.upstream, 16<<10)
	s.uw = bufio.NewWriterSize(s.upstream, 16<<10)
	for {
		again, err := s.serveRequest()
		if err != nil || !again {
			return err
		}
	}
}

// bind splits the interceptor's secrets by s.host: those bound to it are
// injected, placeholders of all others are blocked; the placeholder of a
// bound header-scoped secret is blocked outside its header.
func (s *session) bind() {
	s.names = map[string]string{}
	s.foreign = map[string]bool{}
	var foreign, body []string
	for _, b := range s.ic.Secrets {
		s.names[b.Placeholder] = b.Name
		bound := false
		for _, h := range b.Hosts {
			if HostMatches(h, s.host) {
				bound = true
				break
			}
		}
		switch {
		case !bound:
			foreign = append(foreign, b.Placeholder)
			s.foreign[b.Placeholder] = true
		case b.Header != "":
			s.scoped = append(s.scoped, scopedSecret{name: b.Name, header: b.Header, scan: NewScanner([]string{b.Placeholder})})
			body = append(body, b.Placeholder)
		}
		if bound {
			s.inject.bound = append(s.inject.bound, b)
		}
	}
	s.scanner = NewScanner(foreign)
	s.bodyScan = NewScanner(append(foreign, body...))
}

// scopedSecret is a secret bound to the session's host and scoped to one
// header.
type scopedSecret struct {
	name, header string
	scan         *Scanner // its placeholder
}

// misplaced returns the name of a header-scoped secret whose placeholder
// the request carries outside the secret's header: in target (the request
// target, or :path), or in the name or a value of any other header field.
func (s *session) misplaced(target string, h http.Header) (string, bool) {
	for _, sc := range s.scoped {
		if _, ok := sc.scan.Find([]byte(target)); ok {
			return sc.name, true
		}
		for k, vs := range h {
			if strings.EqualFold(k, sc.header) {
				continue
			}
			if _, ok := sc.scan.Find([]byte(k)); ok {
				return sc.name, true
			}
			for _, v := range vs {
				if _, ok := sc.scan.Find([]byte(v)); ok {
					return sc.name, true
				}
			}
		}
	}
	return "", false
}

// placeholderRefusal is the refusal for a placeholder found in a request
// (in its body when inBody): one of a secret bound elsewhere, or of a
// header-scoped secret outside its header.
func (s *session) placeholderRefusal(ph string, inBody bool) *refusal {
	switch {
	case !s.foreign[ph]:
		return refuse(http.StatusForbidden, "request carries the placeholder of a header-scoped secret outside its header")
	case inBody:
		return refuse(http.StatusForbidden, "request body carries the placeholder of a secret not bound to this host")
	}
	return refuse(http.StatusForbidden, "request carries the placeholder of a secret not bound to this host")
}

// scrubber returns the response scrubber as it stands now.
func (s *session) scrubber() *replacer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scrub
}

// addCredentials adds the scrub rules for Basic credentials the injector
// built (the first maxCredentials of the connection) and returns the
// scrubber to use for the response.
func (s *session) addCredentials(creds []credential) *replacer {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range creds {
		if s.ncreds < maxCredentials {
			s.ncreds++
			s.scrub = s.scrub.with(credentialRules(c))
		}
	}
	return s.scrub
}

// serveRequest relays one request and its response. It reports whether the
// connection may carry another request.
func (s *session) serveRequest() (again bool, err error) {
	raw, err := s.readHead()
	if err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return false, s.refuse(r, Event{})
		}
		if errors.Is(err, errIdle) {
			return false, nil
		}
		return false, err
	}
	h, r := checkHead(raw)
	if r != nil {
		return false, s.refuse(r, Event{})
	}
	if ph, ok := s.scanner.Find(raw); ok {
		return false, s.refuse(s.placeholderRefusal(ph, false), Event{Secrets: []string{s.names[ph]}})
	}
	req, err := http.ReadRequest(s.gr)
	if err != nil {
		return false, s.refuse(refuse(http.StatusBadRequest, "malformed request"), Event{})
	}
	defer req.Body.Close()
	ev := Event{Method: req.Method, Path: auditPath(req.URL.Path)}
	if name, ok := s.misplaced(req.RequestURI, req.Header); ok {
		return false, s.refuse(s.placeholderRefusal("", false), withSecret(ev, name))
	}
	if !sameAuthority(h.host, s.host) {
		return false, s.refuse(refuse(http.StatusMisdirectedRequest, "Host header does not match the TLS server name"), ev)
	}
	if req.URL.IsAbs() && (!strings.EqualFold(req.URL.Scheme, "https") || !sameAuthority(req.URL.Host, s.host) || req.URL.User != nil) {
		return false, s.refuse(refuse(http.StatusMisdirectedRequest, "request URL names another host"), ev)
	}
	if h.expect == "100-continue" {
		req.Header.Del("Expect")
		if _, err := io.WriteString(s.gw, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false, err
		}
		if err := s.gw.Flush(); err != nil {
			return false, err
		}
	}

	injected, creds := s.inject.request(req)
	for _, c := range creds {
		if c.colonInUser {
			return false, s.refuse(refuse(http.StatusBadRequest, "a secret whose value has a colon cannot be the user-id of a Basic credential"), ev)
		}
	}
	s.addCredentials(creds)
	// Responses come back identity-encoded, so that they can be scrubbed
	// (relayResponse decodes gzip and deflate if the upstream encodes
	// anyway). A request carrying a value asks for the whole response: a
	// range could cut the value into pieces no scrubber recognises.
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Del("TE")
	if len(injected) > 0 {
		req.Header.Del("Range")
		req.Header.Del("If-Range")
	}
	req.URL.Scheme, req.URL.Host, req.URL.User = "", "", nil
	req.Host = h.host
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keep Request.Write from adding Go's
	}
	body := &guardedBody{src: req.Body, scan: s.bodyScan}
	if req.Body != http.NoBody {
		if req.ContentLength >= 0 && req.ContentLength <= maxBufferedBody {
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return false, fmt.Errorf("read request body: %w", err)
			}
			if ph, ok := s.bodyScan.Find(b); ok {
				return false, s.refuse(s.placeholderRefusal(ph, true), withSecret(ev, s.names[ph]))
			}
			req.Body = io.NopCloser(bytes.NewReader(b))
		} else {
			req.Body = body
		}
	}
	werr := req.Write(s.uw)
	if werr == nil {
		werr = s.uw.Flush()
	}
	if pe := body.blocked(); pe != nil {
		return false, s.refuse(s.placeholderRefusal(pe.Placeholder, true), withSecret(ev, s.names[pe.Placeholder]))
	}
	if werr != nil {
		return false, s.upstreamFailed(ev, fmt.Errorf("send request upstream: %w", werr))
	}
	if len(injected) > 0 {
		s.emit(Event{Action: ActionInject, Secrets: injected, Method: ev.Method, Path: ev.Path})
	}
	return s.relayResponse(req, ev, len(injected) > 0, h.websocket)
}

// relayResponse reads the upstream's response to req, scrubs it and writes
// it to the guest. injected says whether req carried a value, websocket
// whether it was a WebSocket handshake (which a 101 answer completes).
func (s *session) relayResponse(req *http.Request, ev Event, injected, websocket bool) (again bool, err error) {
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(s.ur, req)
		if err != nil {
			return false, s.upstreamFailed(ev, fmt.Errorf("read upstream response: %w", err))
		}
		if resp.StatusCode >= 200 || resp.StatusCode < 100 {
			break
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if websocket && strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
				return false, s.relayWebSocket(resp)
			}
			return false, s.upstreamFailed(ev, errors.New("upstream switched protocols"))
		}
		if err := s.writeInterim(resp); err != nil {
			return false, err
		}
	}
	defer resp.Body.Close()
	if injected && resp.StatusCode == http.StatusPartialContent {
		return false, s.refuse(refuse(http.StatusBadGateway, "upstream sent a partial response to a request carrying a secret"), ev)
	}
	s.scrubHeader(resp.Header)
	resp.Header.Del("Trailer")
	resp.Trailer = nil // trailers are dropped rather than scrubbed
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	resp.Close = resp.Close || req.Close
	resp.Status = ""

	hasBody := resp.Body != http.NoBody && req.Method != http.MethodHead &&
		resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
	if hasBody {
		coding, ok := contentCoding(resp.Header)
		if !ok {
			return false, s.refuse(refuse(http.StatusBadGateway, "upstream response has a Content-Encoding that cannot be scrubbed"), ev)
		}
		body, length, err := s.scrubBody(resp, coding, true)
		if err != nil {
			return false, s.upstreamFailed(ev, err)
		}
		resp.Body, resp.ContentLength = body, length
		if length < 0 {
			resp.TransferEncoding = []string{"chunked"}
			resp.Header.Del("Content-Length")
		}
	}
	if err := resp.Write(s.gw); err != nil {
		return false, fmt.Errorf("relay response: %w", err)
	}
	if err := s.gw.Flush(); err != nil {
		return false, fmt.Errorf("relay response: %w", err)
	}
	return !resp.Close && !websocket, nil
}

// scrubBody returns resp's body decoded (if coding is not "") and scrubbed,
// and its length (-1: unknown, sent chunked). With buffer, a body of at most
// maxBufferedBody bytes (after decoding) is read whole and keeps an exact
// length; a larger one, one of unknown length, or any without buffer, is
// streamed. A decoded body is never held whole: decompression goes at the
// pace the guest reads.
func (s *session) scrubBody(resp *http.Response, coding string, buffer bool) (io.ReadCloser, int64, error) {
	scrub := s.scrubber()
	if coding == "" {
		if buffer && resp.ContentLength >= 0 && resp.ContentLength <= maxBufferedBody {
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				return nil, 0, fmt.Errorf("read upstream response body: %w", err)
			}
			b, _ = scrub.transform(nil, b, true)
			return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		}
		return replaceReader(resp.Body, scrub), -1, nil
	}
	dec, err := newDecoder(coding, resp.Body)
	if err != nil {
		return nil, 0, fmt.Errorf("decode upstream response body (%s): %w", coding, err)
	}
	// The guest gets the decoded representation: headers describing the
	// encoded one go.
	for _, h := range []string{"Content-Encoding", "Content-Length", "Content-MD5", "Content-Digest", "Repr-Digest", "Digest"} {
		resp.Header.Del(h)
	}
	if !buffer {
		return replaceReader(struct {
			io.Reader
			io.Closer
		}{dec, resp.Body}, scrub), -1, nil
	}
	b, err := io.ReadAll(io.LimitReader(dec, maxBufferedBody+1))
	if err != nil {
		return nil, 0, fmt.Errorf("decode upstream response body (%s): %w", coding, err)
	}
	if len(b) <= maxBufferedBody {
		b, _ = scrub.transform(nil, b, true)
		return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	}
	rest := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), dec), resp.Body}
	return replaceReader(rest, scrub), -1, nil
}

// writeInterim relays a 1xx response (headers only).
func (s *session) writeInterim(resp *http.Response) error {
	s.scrubHeader(resp.Header)
	// Writes to s.gw fail only once the guest is gone; Flush reports it.
	_, _ = fmt.Fprintf(s.gw, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
	_ = resp.Header.Write(s.gw)
	_, _ = io.WriteString(s.gw, "\r\n")
	if err := s.gw.Flush(); err != nil {
		return fmt.Errorf("relay interim response: %w", err)
	}
	return nil
}

// scrubHeader replaces every real value in h by its placeholder and drops
// fields whose names carry one.
func (s *session) scrubHeader(h http.Header) {
	scrub := s.scrubber()
	for name, values := range h {
		if scrub.contains(name) {
			delete(h, name)
			continue
		}
		for i, v := range values {
			values[i] = scrub.String(v)
		}
	}
}

// upstreamFailed tells the guest the upstream failed, audits it and returns err.
func (s *session) upstreamFailed(ev Event, err error) error {
	ev.Action, ev.Reason = ActionError, s.scrubber().String(err.Error())
	s.emit(ev)
	s.writeStatus(http.StatusBadGateway, "upstream request failed")
	return err
}

// refuse answers the guest with r, audits a block and returns an error
// wrapping ErrRefused.
func (s *session) refuse(r *refusal, ev Event) error {
	ev.Action, ev.Reason = ActionBlock, r.reason
	s.emit(ev)
	s.writeStatus(r.status, r.reason)
	return fmt.Errorf("%w: %s", ErrRefused, r.reason)
}

// writeStatus sends a short plain-text response and ends the connection
// (best effort: the guest may be gone).
func (s *session) writeStatus(status int, reason string) {
	body := "airlock: " + reason + "\n"
	_, _ = fmt.Fprintf(s.gw, "HTTP/1.1 %03d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	_ = s.gw.Flush()
}

// errIdle reports that the guest closed or idled out between requests.
var errIdle = errors.New("connection idle")

// readHead waits for a complete request head ("\r\n\r\n") in s.gr's buffer
// without consuming it. A head larger than MaxHeaderBytes is a refusal.
func (s *session) readHead() ([]byte, error) {
	for {
		buf, _ := s.gr.Peek(s.gr.Buffered())
		if i := bytes.Index(buf, []byte("\r\n\r\n")); i >= 0 {
			return buf[:i+4], nil
		}
		if len(buf) >= s.gr.Size() {
			return nil, refuse(http.StatusRequestHeaderFieldsTooLarge, "request head too large")
		}
		if _, err := s.gr.Peek(len(buf) + 1); err != nil {
			if len(buf) == 0 && (errors.Is(err, io.EOF) || isTimeout(err)) {
				return nil, errIdle
			}
			return nil, fmt.Errorf("read request: %w", err)
		}
	}
}

func (r *refusal) Error() string { return r.reason }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func auditPath(p string) string {
	if len(p) > maxAuditPath {
		return p[:maxAuditPath]
	}
	return p
}

func withSecret(ev Event, name string) Event {
	ev.Secrets = []string{name}
	return ev
}

// guardedBody streams a request body through a Guard so that a placeholder
// of a foreign secret stops it. err records the guard's verdict, which
// Request.Write does not pass on in a form errors.As can see.
type guardedBody struct {
	src  io.ReadCloser
	scan *Scanner
	g    *Guard
	out  bytes.Buffer
	buf  []byte
	done bool
	err  error
	// found is the guard's verdict, for a reader on another goroutine (an
	// HTTP/2 transport reads the body on its own).
	found atomic.Pointer[PlaceholderError]
}

// blocked returns the placeholder the guard stopped, or nil.
func (b *guardedBody) blocked() *PlaceholderError { return b.found.Load() }

func (b *guardedBody) fail(err error) error {
	b.err = err
	var pe *PlaceholderError
	if errors.As(err, &pe) {
		b.found.Store(pe)
	}
	return err
}

func (b *guardedBody) Read(p []byte) (int, error) {
	if b.g == nil {
		b.g = b.scan.Guard(&b.out)
		b.buf = make([]byte, 32<<10)
	}
	for b.out.Len() == 0 && !b.done {
		if b.err != nil {
			return 0, b.err
		}
		n, err := b.src.Read(b.buf)
		if n > 0 {
			if _, werr := b.g.Write(b.buf[:n]); werr != nil {
				return 0, b.fail(werr)
			}
		}
		if errors.Is(err, io.EOF) {
			if ferr := b.g.Flush(); ferr != nil {
				return 0, b.fail(ferr)
			}
			b.done = true
		} else if err != nil {
			return 0, err
		}
	}
	if b.out.Len() > 0 {
		return b.out.Read(p)
	}
	return 0, io.EOF
}

func (b *guardedBody) Close() error { return b.src.Close() }

// deadlineConn sets a fresh deadline before every Read and Write, so each
// waits at most read or write. A zero read timeout leaves reads without a
// deadline. The timeouts change only while no Read or Write is running.
type deadlineConn struct {
	net.Conn
	read, write time.Duration
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	if c.read > 0 {
		if err := c.SetReadDeadline(time.Now().Add(c.read)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if err := c.SetWriteDeadline(time.Now().Add(c.write)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// setRead changes the read timeout (0: none) and clears the deadline the
// last Read set.
func (c *deadlineConn) setRead(d time.Duration) {
	c.read = d
	_ = c.SetReadDeadline(time.Time{})
}
