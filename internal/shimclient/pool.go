package shimclient

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"

	"golang.org/x/net/http2"
)

// MaxMessageBytes caps one message read from a shim.
const MaxMessageBytes = 8 << 20

// Pool holds one client per shim socket. Safe for concurrent use.
type Pool struct {
	mu      sync.Mutex
	clients map[string]*Client // by socket path
}

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{clients: map[string]*Client{}} }

// Get returns the client for the shim serving sock, creating it on first
// use. It does not dial: the first call does.
func (p *Pool) Get(sock string) *Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clients[sock]
	if !ok {
		c = newClient(sock)
		p.clients[sock] = c
	}
	return c
}

// Drop closes and forgets the client of sock (its shim exited, paused or
// was removed). Streams still open on it fail.
func (p *Pool) Drop(sock string) {
	p.mu.Lock()
	c := p.clients[sock]
	delete(p.clients, sock)
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Close closes every client.
func (p *Pool) Close() {
	p.mu.Lock()
	cs := p.clients
	p.clients = map[string]*Client{}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// Client talks to one shim over one pooled HTTP/2 (h2c) connection.
type Client struct {
	sock string
	tr   *http2.Transport
	hc   *http.Client

	mu    sync.Mutex
	conns []net.Conn
}

// New returns a client for the shim serving sock that is not part of a
// pool: the caller closes it.
func New(sock string) *Client { return newClient(sock) }

func newClient(sock string) *Client {
	c := &Client{sock: sock}
	c.tr = &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", sock)
			if err == nil {
				c.mu.Lock()
				c.conns = append(c.conns, conn)
				c.mu.Unlock()
			}
			return conn, err
		},
	}
	c.hc = &http.Client{Transport: c.tr}
	return c
}

// baseURL is the URL prefix of every shim service (the host is ignored).
const baseURL = "http://shim"

// Close closes every connection the client dialed (a cancelled stream can
// keep a connection busy after its body was closed, so idle-only closing
// would leak it). Calls in flight fail.
func (c *Client) Close() {
	c.tr.CloseIdleConnections()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

// Dials reports how many connections the client has dialed so far (tests
// and benchmarks check that calls share one).
func (c *Client) Dials() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}
