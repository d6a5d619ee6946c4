package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Local serves the API to the process that made it, over in-memory
// connections: no socket, no port, no daemon. The CLI works through it on
// its own state dir, so each command has one body whether it talks to a
// remote `airlock serve` or to the local manager.
//
// A request that arrives through Local acts as the caller given to
// ServeLocal without an API key or rate limit: only code of this process
// can dial it, so the trust is the process's own. Its errors carry the
// manager's full text (the caller is the host's own user, who may see host
// details) and no request id (there is no server log to look it up in).
type Local struct {
	srv    *http.Server
	s      *Server
	ln     *memListener
	client *http.Client
	done   chan struct{}
}

type localCallerKey struct{}

// localCaller returns the caller of a request that came through Local.
func localCaller(r *http.Request) (sandbox.Caller, bool) {
	c, ok := r.Context().Value(localCallerKey{}).(sandbox.Caller)
	return c, ok
}

// ServeLocal starts serving s in memory for caller c. Close it when done.
func (s *Server) ServeLocal(c sandbox.Caller) *Local {
	ln := newMemListener()
	base := context.WithValue(context.Background(), localCallerKey{}, c)
	l := &Local{
		s:    s,
		ln:   ln,
		done: make(chan struct{}),
		srv: &http.Server{
			Handler:     s,
			BaseContext: func(net.Listener) context.Context { return base },
		},
	}
	l.client = &http.Client{Transport: &http.Transport{
		DialContext:         ln.dial,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     time.Minute,
		// The API answers uncompressed; a local transport has nothing to
		// save.
		DisableCompression: true,
	}}
	go func() {
		defer close(l.done)
		_ = l.srv.Serve(ln)
	}()
	return l
}

// Client returns the HTTP client that reaches the server; any host name in
// its URLs does.
func (l *Local) Client() *http.Client { return l.client }

// Close stops serving: requests still running are cut (their contexts
// end), and Close waits, up to localDrain, for their handlers to return,
// so that what they undo on the way out (a template build's builder
// sandbox) is undone before the caller closes the manager under them.
func (l *Local) Close() error {
	l.client.CloseIdleConnections()
	err := l.srv.Close()
	<-l.done
	ctx, cancel := context.WithTimeout(context.Background(), localDrain)
	defer cancel()
	_ = l.s.WaitIdle(ctx)
	return err
}

// localDrain bounds how long Local.Close waits for cut requests' handlers.
const localDrain = 30 * time.Second

// memListener is a net.Listener of in-memory connections: it hands the
// server one end of each connection dial makes.
type memListener struct {
	conns     chan net.Conn
	closeOnce sync.Once
	closed    chan struct{}
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

var errLocalClosed = errors.New("api: local server closed")

func (p *memListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case p.conns <- server:
		return client, nil
	case <-p.closed:
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
	client.Close()
	server.Close()
	return nil, errLocalClosed
}

func (p *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}

func (p *memListener) Close() error {
	p.closeOnce.Do(func() { close(p.closed) })
	return nil
}

func (p *memListener) Addr() net.Addr { return memAddr{} }

type memAddr struct{}

func (memAddr) Network() string { return "pipe" }
func (memAddr) String() string  { return "airlock-local" }
