package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/airlock-sandbox/airlock/internal/browser"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// A session's browser tools keep, per sandbox, a browserState: which tab
// they act on, the refs of each tab's last snapshot, and (while in use) a
// DevTools connection to the sandbox's Chromium. The connection is closed
// after browserIdle without a call (an open connection counts as activity
// that keeps the sandbox from pausing) and when the session ends; the
// browser and its tabs are the sandbox's and stay as they are. Element
// refs survive a reconnect: DOM backend node ids belong to the page, not
// to the connection.

// browserIdle is how long a browser connection outlives its last call.
const browserIdle = 15 * time.Second

// browsers is the browser state of one session. The zero value is ready.
type browsers struct {
	// idlers are the timers' closing of idle connections.
	idlers sync.WaitGroup

	mu     sync.Mutex
	ctx    context.Context // parent of every connection; cancelled by close
	stop   context.CancelFunc
	states map[string]*browserState // by sandbox id
	closed bool
}

// browserState is the browser state of one sandbox. Its fields are
// guarded by lock (a call or the idle closer holds it).
type browserState struct {
	lock chan struct{}

	conn    *browserConn // nil while closed
	started bool         // StartBrowser answered once (no ErrNoBrowser)
	idle    *time.Timer
	// current is the tab the tools act on ("" until the first call).
	current target.ID
	// order is every page tab seen, first seen first: a tab's index in
	// browser_tabs.
	order []target.ID
	// refs are the element refs of each tab; nextRef numbers new ones
	// (refs are unique across the sandbox's tabs).
	refs    map[target.ID]*tabRefs
	nextRef int
}

// browserConn is one DevTools connection to a sandbox's Chromium.
type browserConn struct {
	// root is a chromedp context attached to the browser, with no tab of
	// its own; cancel closes the connection.
	root   context.Context
	cancel func()
	// tabs are the tabs attached on this connection.
	tabs map[target.ID]*attachedTab
}

// attachedTab is a chromedp context attached to one tab. Its cancel
// detaches and leaves the tab open.
type attachedTab struct {
	ctx    context.Context
	cancel context.CancelFunc
	load   *tabLoad
}

// tabLoad follows whether a tab's page is loading another (from the
// tab's events, while attached).
type tabLoad struct {
	main cdp.FrameID // a page's main frame has its target's id

	mu      sync.Mutex
	pending bool          // a navigation was requested or is loading
	idle    chan struct{} // closed when pending turns false
}

func newTabLoad(id target.ID) *tabLoad {
	l := &tabLoad{main: cdp.FrameID(id), idle: make(chan struct{})}
	close(l.idle)
	return l
}

// listen takes the tab's events (a chromedp listener: fast, no calls).
func (l *tabLoad) listen(ev any) {
	switch e := ev.(type) {
	case *page.EventFrameRequestedNavigation:
		if e.FrameID == l.main && e.Disposition == page.ClientNavigationDispositionCurrentTab {
			l.set(true)
		}
	case *page.EventFrameStartedLoading:
		if e.FrameID == l.main {
			l.set(true)
		}
	case *page.EventFrameStoppedLoading:
		if e.FrameID == l.main {
			l.set(false)
		}
	case *page.EventNavigatedWithinDocument:
		if e.FrameID == l.main {
			l.set(false)
		}
	}
}

func (l *tabLoad) set(pending bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case pending && !l.pending:
		l.idle = make(chan struct{})
	case !pending && l.pending:
		close(l.idle)
	}
	l.pending = pending
}

// wait waits until no navigation is pending, at most d (then it gives up
// on the navigation: one that never loads must not slow every call). It
// reports whether it waited, and whether the page was still loading.
func (l *tabLoad) wait(ctx context.Context, d time.Duration) (waited, loading bool) {
	l.mu.Lock()
	idle, pending := l.idle, l.pending
	l.mu.Unlock()
	if !pending {
		return false, false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true, false
	case <-t.C:
		l.set(false)
		return true, true
	case <-ctx.Done():
		return true, true
	}
}

// acquire returns id's state with its lock held (release it), waiting
// for another call on the same sandbox to end.
func (b *browsers) acquire(ctx context.Context, id string) (*browserState, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: the session has ended", errdefs.ErrFailedPrecondition)
	}
	if b.states == nil {
		b.states = map[string]*browserState{}
		b.ctx, b.stop = context.WithCancel(context.Background())
	}
	st := b.states[id]
	if st == nil {
		st = &browserState{lock: make(chan struct{}, 1), refs: map[target.ID]*tabRefs{}}
		b.states[id] = st
	}
	b.mu.Unlock()
	select {
	case st.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if st.idle != nil {
		st.idle.Stop()
		st.idle = nil
	}
	if st.conn != nil && st.conn.root.Err() != nil { // lost (a pause, a restart)
		st.conn.close()
		st.conn = nil
	}
	return st, nil
}

// release unlocks st and closes its connection after browserIdle unless
// another call comes first.
func (b *browsers) release(st *browserState) {
	if st.conn != nil {
		st.idle = time.AfterFunc(browserIdle, func() { b.closeIdle(st) })
	}
	<-st.lock
}

// closeIdle closes st's connection unless a call holds st (its release
// sets a new timer).
func (b *browsers) closeIdle(st *browserState) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.idlers.Add(1)
	b.mu.Unlock()
	defer b.idlers.Done()
	select {
	case st.lock <- struct{}{}:
	default:
		return
	}
	if st.conn != nil {
		st.conn.close()
		st.conn = nil
	}
	<-st.lock
}

// disconnect closes the connection to sandbox id, keeping its state (a
// pause, snapshot or fork waits for the sandbox's inbound connections to
// end; the next browser call reconnects, and refs survive that).
func (b *browsers) disconnect(id string) {
	b.mu.Lock()
	st := b.states[id]
	b.mu.Unlock()
	closeConn(st)
}

// drop closes the connection to sandbox id and forgets its state (the
// sandbox is gone).
func (b *browsers) drop(id string) {
	b.mu.Lock()
	st := b.states[id]
	delete(b.states, id)
	b.mu.Unlock()
	closeConn(st)
}

// closeConn closes st's connection (nil st: nothing), waiting for a call
// that holds it.
func closeConn(st *browserState) {
	if st == nil {
		return
	}
	st.lock <- struct{}{}
	if st.idle != nil {
		st.idle.Stop()
	}
	if st.conn != nil {
		st.conn.close()
		st.conn = nil
	}
	<-st.lock
}

// close ends every connection (calls in flight fail at once) and waits
// for them. Idempotent.
func (b *browsers) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	states := b.states
	b.states = nil
	if b.stop != nil {
		b.stop()
	}
	b.mu.Unlock()
	for _, st := range states {
		st.lock <- struct{}{}
		if st.idle != nil {
			st.idle.Stop()
		}
		if st.conn != nil {
			st.conn.close()
			st.conn = nil
		}
		<-st.lock
	}
	b.idlers.Wait()
}

// close detaches from every tab (leaving them open) and closes the
// connection.
func (c *browserConn) close() {
	for _, t := range c.tabs {
		t.cancel()
	}
	c.cancel()
}

// connect opens st's connection to sandbox id's Chromium (started first
// if it is not running) through dial. ctx bounds the connect only.
func (b *browsers) connect(ctx context.Context, st *browserState, log *slog.Logger, dial browser.Dialer) error {
	b.mu.Lock()
	parent := b.ctx
	b.mu.Unlock()
	if parent == nil || parent.Err() != nil {
		return fmt.Errorf("%w: the session has ended", errdefs.ErrFailedPrecondition)
	}
	logf := func(format string, args ...any) {
		if log.Enabled(context.Background(), slog.LevelDebug) {
			log.Debug("browser: " + fmt.Sprintf(format, args...))
		}
	}
	root, cancel := browser.NewContext(parent, browser.DialConnect(dial), chromedp.WithLogf(logf), chromedp.WithErrorf(logf))
	cancel = sync.OnceFunc(cancel)
	stop := context.AfterFunc(ctx, cancel)
	// The first call on root binds the connection to root (not to ctx).
	_, err := chromedp.Targets(root)
	stop()
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errdefs.Category(err) != "internal" {
			return err
		}
		return fmt.Errorf("%w: connect to the sandbox's browser: %v", errdefs.ErrUnavailable, err)
	}
	st.conn = &browserConn{root: root, cancel: cancel, tabs: map[target.ID]*attachedTab{}}
	return nil
}

// pageTabs lists the browser's page tabs in st's order (first seen
// first), adding new ones to it and dropping closed ones.
func (st *browserState) pageTabs(ctx context.Context) ([]*target.Info, error) {
	infos, err := chromedp.Targets(ctx)
	if err != nil {
		return nil, err
	}
	var pages []*target.Info
	for _, in := range infos {
		if in.Type == "page" && in.Subtype == "" {
			pages = append(pages, in)
		}
	}
	live := map[target.ID]*target.Info{}
	for _, p := range pages {
		live[p.TargetID] = p
	}
	st.order = slices.DeleteFunc(st.order, func(id target.ID) bool { return live[id] == nil })
	for _, p := range pages {
		if !slices.Contains(st.order, p.TargetID) {
			st.order = append(st.order, p.TargetID)
		}
	}
	out := make([]*target.Info, 0, len(st.order))
	for _, id := range st.order {
		out = append(out, live[id])
	}
	for id := range st.refs {
		if live[id] == nil {
			delete(st.refs, id)
		}
	}
	return out, nil
}

// attach returns tab id on st's connection, attaching to it first if
// needed; ctx bounds the attach only.
func (st *browserState) attach(ctx context.Context, id target.ID) (*attachedTab, error) {
	c := st.conn
	if t := c.tabs[id]; t != nil {
		if ch, err := chromedp.Detached(t.ctx); err == nil {
			select {
			case <-ch:
			default:
				if t.ctx.Err() == nil {
					return t, nil
				}
			}
		}
		t.cancel()
		delete(c.tabs, id)
	}
	load := newTabLoad(id)
	tctx, cancel := chromedp.NewContext(c.root, chromedp.WithTargetID(id), chromedp.WithDetachOnCancel(), chromedp.WithListener(load.listen))
	stop := context.AfterFunc(ctx, cancel)
	// The first run on tctx attaches and binds the tab's session to tctx.
	err := chromedp.Do(tctx)
	stop()
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	t := &attachedTab{ctx: tctx, cancel: cancel, load: load}
	c.tabs[id] = t
	return t, nil
}

// detach forgets tab id (closed) on st's connection.
func (st *browserState) detach(id target.ID) {
	if t := st.conn.tabs[id]; t != nil {
		t.cancel()
		delete(st.conn.tabs, id)
	}
	delete(st.refs, id)
	if st.current == id {
		st.current = ""
	}
}

// tabRefs are the element refs of one tab: a ref (e12) per DOM node a
// snapshot showed, the same for a node in every snapshot of its document;
// last holds the last snapshot's, the only ones the tools accept, of the
// document loader loaded (a new document, even one whose old nodes live
// on in the back-forward cache, makes them stale).
type tabRefs struct {
	loader cdp.LoaderID
	byNode map[cdp.BackendNodeID]string
	last   map[string]cdp.BackendNodeID
}

// maxRefNodes bounds a tab's memory of refs: past it, nodes get new refs.
const maxRefNodes = 100_000

// tabRefs returns tab id's refs.
func (st *browserState) tabRefs(id target.ID) *tabRefs {
	r := st.refs[id]
	if r == nil {
		r = &tabRefs{byNode: map[cdp.BackendNodeID]string{}}
		st.refs[id] = r
	}
	return r
}

// refFor returns node's ref in tab r, naming it if new.
func (st *browserState) refFor(r *tabRefs, node cdp.BackendNodeID) string {
	if ref, ok := r.byNode[node]; ok {
		return ref
	}
	if len(r.byNode) >= maxRefNodes {
		clear(r.byNode)
	}
	st.nextRef++
	ref := fmt.Sprintf("e%d", st.nextRef)
	r.byNode[node] = ref
	return ref
}

// dialer is the browser Dialer of caller c's sandbox id.
func dialer(svc Service, c sandbox.Caller, id string) browser.Dialer {
	return func(ctx context.Context) (net.Conn, error) { return svc.DialBrowser(ctx, c, id) }
}

// browserTarget returns id if given and visible, else the session's
// browser sandbox (from the browser image, separate from the sandbox of
// run_code and exec), created on first use.
func (s *session) browserTarget(ctx context.Context, id string) (string, error) {
	sid, err := s.sessionSandbox(ctx, id, &s.browserDef, sandbox.CreateOptions{Image: browserImage, Metadata: map[string]string{"mcp_session": s.id, "mcp_role": "browser"}})
	if err != nil && id == "" && errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("%w: this server has no %q image (an admin builds it with airlock setup --browser)", errdefs.ErrNotFound, browserImage)
	}
	return sid, err
}

// browserImage is the image of the session's browser sandbox.
const browserImage = "browser"
