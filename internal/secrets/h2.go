package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/sync/semaphore"
)

// HTTP/2 limits, on both sides of an intercepted connection.
const (
	// MaxStreams is the most streams a guest may have open at once on one
	// connection (SETTINGS_MAX_CONCURRENT_STREAMS); each is one handler
	// goroutine and at most one upstream stream.
	MaxStreams = 100
	// h2StreamWindow and h2ConnWindow are the flow-control windows each
	// side advertises: what a peer may send before the interceptor reads.
	h2StreamWindow = 256 << 10
	h2ConnWindow   = 1 << 20
	// maxUpstreamHeaderBytes bounds an upstream response's header list.
	maxUpstreamHeaderBytes = 1 << 20
	// h2BufferBudget bounds the bodies one connection's streams hold
	// whole at once (each at most maxBufferedBody; see serveStream).
	h2BufferBudget = 4 << 20
)

// h2Protocols is HTTP/2 only, for the upstream connection.
var h2Protocols = func() *http.Protocols {
	var p http.Protocols
	p.SetHTTP2(true)
	return &p
}()

// serveH2 serves a guest connection that negotiated HTTP/2: the guest's
// streams are served by x/net/http2's server, and each is relayed as one
// stream of the upstream connection (which negotiated h2 too) through
// net/http's HTTP/2 client on that one connection. The request checks,
// injection and response scrubbing are those of HTTP/1.1 (see
// serveStream). The first refusal or upstream failure ends the connection
// gracefully (GOAWAY: streams in flight finish) and is what Serve returns.
func (s *session) serveH2(ctx context.Context) error {
	// Frames arrive whenever the guest sends them, not only between
	// requests: no read deadline (the server's idle timeout and pings
	// take its place); writes keep theirs.
	s.guestConn.setRead(0)

	var dialed atomic.Bool
	tr := &http.Transport{
		Protocols: h2Protocols,
		DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
			if dialed.Swap(true) {
				return nil, errors.New("the upstream connection is gone")
			}
			return s.upstream, nil
		},
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxUpstreamHeaderBytes,
		HTTP2: &http.HTTP2Config{
			StrictMaxConcurrentRequests:   true, // wait for a free upstream stream, never dial again
			MaxReceiveBufferPerConnection: h2ConnWindow,
			MaxReceiveBufferPerStream:     h2StreamWindow,
		},
	}
	cc, err := tr.NewClientConn(ctx, "https", net.JoinHostPort(s.host, "443"))
	if err != nil {
		return fmt.Errorf("upstream http2 connection: %w", err)
	}
	defer cc.Close()

	idle := orDefault(s.ic.IdleTimeout, DefaultIdleTimeout)
	hs := &http.Server{MaxHeaderBytes: orDefault(s.ic.MaxHeaderBytes, DefaultMaxHeaderBytes)}
	h2s := &http2.Server{
		MaxConcurrentStreams:         MaxStreams,
		IdleTimeout:                  idle,
		ReadIdleTimeout:              idle, // then a ping, answered within PingTimeout (15 s)
		WriteByteTimeout:             idle,
		MaxUploadBufferPerConnection: h2ConnWindow,
		MaxUploadBufferPerStream:     h2StreamWindow,
	}
	if err := http2.ConfigureServer(hs, h2s); err != nil {
		return fmt.Errorf("http2 server: %w", err)
	}
	st := &h2session{s: s, cc: cc, budget: semaphore.NewWeighted(h2BufferBudget)}
	// hs.Shutdown starts the graceful shutdown of the one connection
	// h2s serves (ConfigureServer registered it; a second call does
	// nothing more) and returns at once: hs itself serves nothing.
	st.shutdown = func() { _ = hs.Shutdown(context.WithoutCancel(ctx)) }
	cc.SetStateHook(func(cc *http.ClientConn) {
		if cc.Err() != nil {
			st.shutdown() // the upstream went away: so does the guest, gracefully
		}
	})
	h2s.ServeConn(s.guest, &http2.ServeConnOpts{Context: ctx, BaseConfig: hs, Handler: st})
	st.wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// h2session relays one HTTP/2 connection's streams.
type h2session struct {
	s        *session
	cc       *http.ClientConn
	shutdown func()
	// budget is what the streams may hold of bodies read whole. A body
	// that finds no share left is streamed instead: never waiting for one
	// (a stream that waited without reading its body would hold the
	// connection's flow-control window, and the streams holding shares
	// could not read theirs).
	budget *semaphore.Weighted

	mu     sync.Mutex
	closed bool           // ServeConn returned: no new handler starts
	active sync.WaitGroup // handlers running
}

// wait waits for the handlers still running once ServeConn has returned.
func (st *h2session) wait() {
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
	st.active.Wait()
}

func (st *h2session) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return
	}
	st.active.Add(1)
	st.mu.Unlock()
	defer st.active.Done()
	defer r.Body.Close()
	st.serveStream(w, r)
}

// fail records the first error of the connection and starts its graceful
// shutdown.
func (st *h2session) fail(err error) {
	s := st.s
	s.mu.Lock()
	if s.failed == nil {
		s.failed = err
	}
	s.mu.Unlock()
	st.shutdown()
}

// refuse answers one stream with r (if its response has not started),
// audits a block and ends the connection gracefully.
func (st *h2session) refuse(w http.ResponseWriter, started bool, r *refusal, ev Event) {
	ev.Action, ev.Reason = ActionBlock, r.reason
	st.s.emit(ev)
	st.fail(fmt.Errorf("%w: %s", ErrRefused, r.reason))
	if started {
		panic(http.ErrAbortHandler) // reset the stream: its response is cut short
	}
	writeStatusH2(w, r.status, r.reason)
}

// upstreamFailed answers one stream with a 502 (if its response has not
// started), audits the failure and ends the connection gracefully.
func (st *h2session) upstreamFailed(w http.ResponseWriter, started bool, ev Event, err error) {
	s := st.s
	ev.Action, ev.Reason = ActionError, s.scrubber().String(err.Error())
	s.emit(ev)
	st.fail(err)
	if started {
		panic(http.ErrAbortHandler)
	}
	writeStatusH2(w, http.StatusBadGateway, "upstream request failed")
}

func writeStatusH2(w http.ResponseWriter, status int, reason string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "airlock: "+reason+"\n")
}

// h2Head is a request's method, target, authority and header fields, one
// per line, for the placeholder scanner.
func h2Head(r *http.Request) []byte {
	var b bytes.Buffer
	b.WriteString(r.Method + " " + r.RequestURI + "\r\n:authority: " + r.Host + "\r\n")
	for k, vs := range r.Header {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	return b.Bytes()
}

// serveStream checks, injects and relays one guest stream, then scrubs and
// relays the upstream's response. The HTTP/2 server has already refused
// what HTTP/2 forbids (connection-specific fields, TE other than
// "trailers", malformed pseudo-headers, a body longer or shorter than its
// Content-Length) and bounds the header list by MaxHeaderBytes.
func (st *h2session) serveStream(w http.ResponseWriter, r *http.Request) {
	s := st.s
	ev := Event{Method: r.Method, Path: auditPath(r.URL.Path)}
	if ph, ok := s.scanner.Find(h2Head(r)); ok {
		st.refuse(w, false, s.placeholderRefusal(ph, false), withSecret(ev, s.names[ph]))
		return
	}
	if name, ok := s.misplaced(r.RequestURI, r.Header); ok {
		st.refuse(w, false, s.placeholderRefusal("", false), withSecret(ev, name))
		return
	}
	switch hosts, hasHost := r.Header["Host"]; {
	case r.Method == http.MethodConnect:
		st.refuse(w, false, refuse(http.StatusMethodNotAllowed, "CONNECT is not supported"), ev)
		return
	case !sameAuthority(r.Host, s.host) || hasHost && (len(hosts) != 1 || !sameAuthority(hosts[0], s.host)):
		st.refuse(w, false, refuse(http.StatusMisdirectedRequest, "Host header does not match the TLS server name"), ev)
		return
	case r.Header["Trailer"] != nil:
		st.refuse(w, false, refuse(http.StatusNotImplemented, "request trailers are not supported"), ev)
		return
	case r.URL.Opaque != "" || r.URL.User != nil || !strings.HasPrefix(r.RequestURI, "/") && r.RequestURI != "*":
		st.refuse(w, false, refuse(http.StatusBadRequest, "malformed request target"), ev)
		return
	}

	injected, creds := s.inject.request(r)
	for _, c := range creds {
		if c.colonInUser {
			st.refuse(w, false, refuse(http.StatusBadRequest, "a secret whose value has a colon cannot be the user-id of a Basic credential"), ev)
			return
		}
	}
	s.addCredentials(creds)
	h := r.Header
	h.Del("Host")
	h.Del("Expect") // the server answered 100-continue itself
	h.Set("Accept-Encoding", "identity")
	h.Del("TE")
	if len(injected) > 0 {
		h.Del("Range")
		h.Del("If-Range")
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""} // keep the transport from adding Go's
	}

	out := &http.Request{
		Method: r.Method,
		URL:    &url.URL{Scheme: "https", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery},
		Header: h,
		Host:   r.Host,
		Body:   http.NoBody,
	}
	body := &guardedBody{src: r.Body, scan: s.bodyScan}
	held := int64(0)
	defer func() { st.budget.Release(held) }()
	switch {
	case r.ContentLength == 0 || r.ContentLength > 0 && r.ContentLength <= maxBufferedBody && st.budget.TryAcquire(r.ContentLength):
		held = r.ContentLength
		b, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
		if err != nil {
			return // the guest reset the stream
		}
		if ph, ok := s.bodyScan.Find(b); ok {
			st.refuse(w, false, s.placeholderRefusal(ph, true), withSecret(ev, s.names[ph]))
			return
		}
		if len(b) > 0 {
			out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		}
	default:
		out.Body, out.ContentLength = body, -1
	}
	out = out.WithContext(r.Context())

	resp, err := st.cc.RoundTrip(out)
	st.budget.Release(held)
	held = 0
	if pe := body.blocked(); pe != nil {
		if resp != nil {
			resp.Body.Close()
		}
		st.refuse(w, false, s.placeholderRefusal(pe.Placeholder, true), withSecret(ev, s.names[pe.Placeholder]))
		return
	}
	if err != nil {
		if r.Context().Err() != nil {
			return // the guest reset the stream or went away
		}
		st.upstreamFailed(w, false, ev, fmt.Errorf("upstream round trip: %w", err))
		return
	}
	defer resp.Body.Close()
	if len(injected) > 0 {
		s.emit(Event{Action: ActionInject, Secrets: injected, Method: ev.Method, Path: ev.Path})
	}
	st.relay(w, r, resp, ev, len(injected) > 0, body)
}

// relay scrubs the upstream's response and writes it to the guest stream.
func (st *h2session) relay(w http.ResponseWriter, r *http.Request, resp *http.Response, ev Event, injected bool, body *guardedBody) {
	s := st.s
	if injected && resp.StatusCode == http.StatusPartialContent {
		st.refuse(w, false, refuse(http.StatusBadGateway, "upstream sent a partial response to a request carrying a secret"), ev)
		return
	}
	s.scrubHeader(resp.Header)
	for _, k := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Trailer"} {
		resp.Header.Del(k)
	}
	hasBody := r.Method != http.MethodHead && resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
	var src io.ReadCloser = http.NoBody
	length := int64(0)
	if hasBody {
		coding, ok := contentCoding(resp.Header)
		if !ok {
			st.refuse(w, false, refuse(http.StatusBadGateway, "upstream response has a Content-Encoding that cannot be scrubbed"), ev)
			return
		}
		// Read whole (exact Content-Length) only within the budget.
		want := int64(maxBufferedBody + 1)
		if coding == "" {
			want = resp.ContentLength
		}
		buffer := want >= 0 && want <= maxBufferedBody+1 && st.budget.TryAcquire(want)
		if buffer {
			defer st.budget.Release(want)
		}
		var err error
		src, length, err = s.scrubBody(resp, coding, buffer)
		if err != nil {
			st.failedMidway(w, false, ev, body, err)
			return
		}
		defer src.Close()
	}
	wh := w.Header()
	for k, vs := range resp.Header {
		wh[k] = vs
	}
	// Nothing the upstream did not send: no sniffed Content-Type, no Date.
	for _, k := range []string{"Content-Type", "Date"} {
		if _, ok := wh[k]; !ok {
			wh[k] = nil
		}
	}
	switch {
	case !hasBody:
	case length >= 0:
		wh.Set("Content-Length", fmt.Sprint(length))
	default:
		wh.Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	if !hasBody {
		return
	}
	if length >= 0 {
		_, _ = io.Copy(w, src) // in memory already, scrubbed; an error is the guest's reset
		return
	}
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the guest reset the stream or went away
			}
			if rc.Flush() != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			if r.Context().Err() != nil {
				return // the guest reset the stream or went away
			}
			st.failedMidway(w, true, ev, body, fmt.Errorf("read upstream response body: %w", err))
			return
		}
	}
}

// failedMidway handles an upstream response that failed after its head
// arrived: a request body the guard stopped (the transport then resets the
// upstream stream) is a refusal, anything else an upstream failure.
func (st *h2session) failedMidway(w http.ResponseWriter, started bool, ev Event, body *guardedBody, err error) {
	if pe := body.blocked(); pe != nil {
		st.refuse(w, started, st.s.placeholderRefusal(pe.Placeholder, true), withSecret(ev, st.s.names[pe.Placeholder]))
		return
	}
	st.upstreamFailed(w, started, ev, err)
}
