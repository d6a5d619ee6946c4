package browser

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/chromedp/cdproto"
	jsonv2 "github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
)

// maxMessage caps one DevTools message from the browser (a full-page
// screenshot of a long page is tens of MiB of base64).
const maxMessage = 128 << 20

// Connect opens a DevTools connection to a browser target: Dial through a
// Dialer (in the server), or NewTransport over a WebSocket the Go SDK
// opened (Client.BrowserWebSocket, in the CLI).
type Connect func(ctx context.Context) (chromedp.Transport, error)

// DialConnect is the Connect of a Dialer.
func DialConnect(d Dialer) Connect {
	return func(ctx context.Context) (chromedp.Transport, error) { return Dial(ctx, d) }
}

// NewContext returns a chromedp context attached to the browser connect
// reaches: a new tab of it, closed when the context is cancelled (the
// browser goes on running). Cancel the returned function to close the tab
// and the connection.
func NewContext(parent context.Context, connect Connect, opts ...chromedp.ContextOption) (context.Context, context.CancelFunc) {
	actx, acancel := chromedp.NewAllocatorContext(parent, &allocator{connect: connect})
	ctx, cancel := chromedp.NewContext(actx, opts...)
	return ctx, func() { cancel(); acancel() }
}

// allocator attaches chromedp to a running browser through a Dialer.
type allocator struct {
	connect Connect
	wg      sync.WaitGroup
}

// Allocate dials the browser target's WebSocket.
func (a *allocator) Allocate(ctx context.Context, opts ...chromedp.BrowserOption) (*chromedp.Browser, error) {
	if chromedp.FromContext(ctx) == nil {
		return nil, chromedp.ErrInvalidContext
	}
	// The connection's own context outlives ctx until the tabs of ctx are
	// closed (chromedp.Cancel needs the connection for that).
	wctx, cancel := context.WithCancel(context.Background())
	a.wg.Go(func() {
		<-ctx.Done()
		_ = chromedp.Cancel(ctx)
		cancel()
	})
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer dcancel()
	tr, err := a.connect(dctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return chromedp.NewBrowserTransport(wctx, tr, opts...)
}

func (a *allocator) Wait()          { a.wg.Wait() }
func (a *allocator) Attaches() bool { return true }

// Transport is a chromedp.Transport over a WebSocket to the browser target.
type Transport struct {
	ws  *websocket.Conn
	wmu sync.Mutex
}

// Dial opens the browser target's WebSocket through d.
func Dial(ctx context.Context, d Dialer) (*Transport, error) {
	path, err := browserPath(ctx, d)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return d(ctx) },
		DisableKeepAlives: true,
	}}
	ws, _, err := websocket.Dial(ctx, "ws://"+upstreamHost+path, &websocket.DialOptions{HTTPClient: hc, Host: upstreamHost})
	if err != nil {
		return nil, fmt.Errorf("browser's DevTools WebSocket: %w", err)
	}
	return NewTransport(ws), nil
}

// NewTransport is a Transport over ws, a WebSocket to a browser target.
func NewTransport(ws *websocket.Conn) *Transport {
	ws.SetReadLimit(maxMessage)
	return &Transport{ws: ws}
}

// Read reads the next message.
func (t *Transport) Read(ctx context.Context, msg *cdproto.Message) error {
	_, data, err := t.ws.Read(ctx)
	if err != nil {
		return err
	}
	return jsonv2.Unmarshal(data, msg, chromedp.DefaultUnmarshalOptions)
}

// Write writes a message as one text frame (Chromium does not take
// fragmented messages).
func (t *Transport) Write(ctx context.Context, msg *cdproto.Message) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	b, err := jsonv2.Marshal(msg, chromedp.DefaultMarshalOptions)
	if err != nil {
		return err
	}
	return t.ws.Write(ctx, websocket.MessageText, b)
}

// Close closes the WebSocket.
func (t *Transport) Close() error {
	return t.ws.CloseNow()
}
