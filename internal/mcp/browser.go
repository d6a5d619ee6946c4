package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The browser tools drive the Chromium of a sandbox made from the browser
// image over the DevTools protocol (chromedp). Everything that comes back
// from the page (titles, text, names in the accessibility tree, values of
// JavaScript, errors) is the page's and is capped.

// Limits of the browser tools.
const (
	maxURLBytes        = 8 << 10
	maxSelectorBytes   = 4 << 10
	maxTypeBytes       = 64 << 10
	maxExpressionBytes = 64 << 10
	maxScreenshotBytes = 8 << 20
	maxPageString      = 500 // runes of a title or URL in a result
	maxScroll          = 1_000_000
	maxNotes           = 10 // of one call: dialogs, tabs the page opened
	// navSettle bounds the wait for a page that a click or key started
	// loading.
	navSettle = 10 * time.Second
)

// addBrowserTools registers the browser tools.
func addBrowserTools(srv *sdk.Server, t *tools) {
	const which = " Without sandbox_id this session's browser sandbox is used: made from the browser image on first use (seconds), and not the sandbox of run_code and exec (give them the sandbox_id of any result to reach its files)."
	add(srv, t, "browser_navigate", "Load a URL in the current tab of a sandbox's browser (Chromium; its traffic follows the sandbox's egress policy) and wait for the page to load. Returns the HTTP status, the final URL and the title."+which, t.browserNavigate)
	add(srv, t, "browser_snapshot", "The current tab's page as its accessibility tree, an element a line with a ref: [e12] button \"Submit\". Give refs to browser_click, browser_type, browser_press, browser_scroll and browser_text; they stay valid while the element lives (an element the page removed, or a ref of an older page, is an error: take a new snapshot). A large page is cut with a note: pass ref to show one part."+which, t.browserSnapshot)
	add(srv, t, "browser_click", "Click an element (ref of browser_snapshot, or a CSS selector) with the mouse as a person would: scrolled into view, at its center. If the click makes the page load another, waits for it (up to 10 s). JavaScript dialogs the page opens are accepted and reported."+which, t.browserClick)
	add(srv, t, "browser_type", "Type text into a field (ref or selector): it replaces the field's text unless append; submit presses Enter after."+which, t.browserType)
	add(srv, t, "browser_press", "Press a key in the current tab, optionally focusing an element (ref or selector) first: Enter, Tab, Escape, ArrowDown, PageDown, a character, or a chord such as Control+A or Shift+Tab."+which, t.browserPress)
	add(srv, t, "browser_scroll", "Scroll with the mouse wheel by dx/dy pixels (over the element if given: the box under it scrolls), or scroll an element (ref or selector) into view."+which, t.browserScroll)
	add(srv, t, "browser_text", "The text of the current tab's page as shown (innerText), or of one element (ref or selector); cut with a note past the result cap."+which, t.browserText)
	add(srv, t, "browser_screenshot", "A PNG screenshot of the current tab: the window, or with full_page the whole page. Returned as an image."+which, t.browserScreenshot)
	add(srv, t, "browser_eval", "Evaluate a JavaScript expression in the current tab's page and return its value as JSON (a promise is awaited); it runs with the page's rights, inside the sandbox. Long values are cut with a note."+which, t.browserEval)
	add(srv, t, "browser_tabs", "List the browser's tabs: index, id, title, url, and the current one (the tab the other browser tools act on)."+which, t.browserTabs)
	add(srv, t, "browser_tab_switch", "Make a tab (index or id from browser_tabs) the current one: the tab the other browser tools act on, and the one shown."+which, t.browserTabSwitch)
	add(srv, t, "browser_tab_new", "Open a new tab, loading url if given, and make it the current one."+which, t.browserTabNew)
	add(srv, t, "browser_tab_close", "Close a tab (index or id from browser_tabs; default: the current one). The tools then act on the first tab."+which, t.browserTabClose)
	add(srv, t, "browser_download", "Download a file with the browser (its cookies and the sandbox's egress policy apply) into the sandbox: to /home/browser/Downloads under the name the server gives (replacing a file of that name), or to path. Returns the file's path inside the sandbox and its size; read it with file_read or exec and the sandbox_id."+which, t.browserDownload)
}

type browserIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox whose browser to use (default: this session's browser sandbox, made from the browser image on first use; it is not the sandbox run_code and exec use without sandbox_id)"`
}

// elementIn names an element: a ref of browser_snapshot or a CSS selector.
type elementIn struct {
	Ref      string `json:"ref,omitempty" jsonschema:"the element's ref in the last browser_snapshot of the tab, e.g. e12"`
	Selector string `json:"selector,omitempty" jsonschema:"a CSS selector (the first match), instead of ref"`
}

// check validates e: one of ref and selector, or none when optional.
func (e elementIn) check(optional bool) (ref, selector string, err error) {
	switch {
	case e.Ref != "" && e.Selector != "":
		return "", "", fmt.Errorf("%w: give ref or selector, not both", errdefs.ErrInvalid)
	case e.Ref != "":
		ref, err = parseRef(e.Ref)
		return ref, "", err
	case e.Selector != "":
		if len(e.Selector) > maxSelectorBytes || strings.IndexByte(e.Selector, 0) >= 0 {
			return "", "", fmt.Errorf("%w: selector must be at most %d bytes", errdefs.ErrInvalid, maxSelectorBytes)
		}
		return "", e.Selector, nil
	case !optional:
		return "", "", fmt.Errorf("%w: give ref (from browser_snapshot) or selector (CSS)", errdefs.ErrInvalid)
	}
	return "", "", nil
}

// browserCall is one browser tool call: its sandbox's state (locked, with
// a connection) and the call's context.
type browserCall struct {
	t   *tools
	ctx context.Context // the call's, with its deadline
	d   time.Duration   // the call's timeout
	id  string          // the sandbox
	st  *browserState
	// done are cancels to run when the call ends.
	done []func()
	bctx context.Context // see browserCtx
}

// browser runs fn on the browser of sandbox sandboxID (the session's
// browser sandbox if ""), connected, under the call's deadline (timeoutS,
// 0 for the default). Making the sandbox and starting its browser (first
// use: seconds, a minute under QEMU without KVM) are bounded apart, like
// other lifecycle steps. Calls on one sandbox run one at a time.
func (t *tools) browser(ctx context.Context, sandboxID string, timeoutS int, fn func(bc *browserCall) (*sdk.CallToolResult, error)) (*sdk.CallToolResult, error) {
	d, err := t.timeout(timeoutS)
	if err != nil {
		return nil, err
	}
	sctx, scancel := context.WithTimeout(ctx, lifecycleTimeout)
	defer scancel()
	id, err := t.s.browserTarget(sctx, sandboxID)
	if err != nil {
		return nil, err
	}
	st, err := t.s.br.acquire(sctx, id)
	if err != nil {
		return nil, err
	}
	defer t.s.br.release(st)
	if !st.started {
		if _, err := t.h.cfg.Service.StartBrowser(sctx, t.s.caller(), id, sandbox.ViewBackground); err != nil {
			if errors.Is(err, sandbox.ErrNoBrowser) {
				return nil, fmt.Errorf("%w; over MCP: sandbox_create with image %q, or leave sandbox_id out to use this session's browser sandbox", err, browserImage)
			}
			return nil, err
		}
		st.started = true
	}
	connected := false
	if st.conn == nil {
		if err := t.s.br.connect(sctx, st, t.h.log.With("session", t.s.id, "sandbox_id", id), dialer(t.h.cfg.Service, t.s.caller(), id)); err != nil {
			return nil, err
		}
		connected = true
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	bc := &browserCall{t: t, ctx: ctx, d: d, id: id, st: st}
	defer func() {
		for _, f := range slices.Backward(bc.done) {
			f()
		}
	}()
	if connected {
		// Downloads (browser_download, and links the page downloads) land
		// in one directory; tabs opening and closing are told.
		if err := bc.downloadsTo(browserDownloadDir); err != nil {
			return bc.fail(err)
		}
		if _, err := chromedp.CallBrowser(bc.browserCtx(), target.SetDiscoverTargets, target.SetDiscoverTargetsParams{Discover: true}); err != nil {
			return bc.fail(err)
		}
	}
	res, err := fn(bc)
	if err != nil {
		return bc.fail(err)
	}
	return res, nil
}

// fail turns err into the call's answer: categorized errors as they are
// (publicText shows their text), the browser's and the page's own errors
// as error results, anything else as an internal error.
func (bc *browserCall) fail(err error) (*sdk.CallToolResult, error) {
	lost := bc.st.conn != nil && bc.st.conn.root.Err() != nil
	if lost {
		bc.st.conn.close()
		bc.st.conn = nil
	}
	if c := errdefs.Category(err); c != "internal" && c != "timeout" && c != "canceled" {
		return nil, err
	}
	var (
		load *chromedp.LoadError
		exc  *chromedp.ExceptionError
		cerr *cdproto.Error
	)
	switch {
	case bc.ctx.Err() != nil:
		return errorResult(fmt.Sprintf("the browser did not finish in %s (raise timeout_s if the tool has it; a page may be slow or a dialog open)", bc.d)), nil
	case lost:
		return errorResult("the connection to the sandbox's browser was lost (the sandbox paused, restarted or stopped); call again"), nil
	case errors.As(err, &load):
		return errorResult("the page did not load: " + capRunes(oneLine(load.ErrorText), maxPageString)), nil
	case errors.As(err, &exc):
		return errorResult("JavaScript exception: " + capRunes(exc.Error(), 4000)), nil
	case errors.Is(err, chromedp.ErrTargetDetached):
		return errorResult("the tab was closed (see browser_tabs)"), nil
	case errors.As(err, &cerr):
		return errorResult("the browser refused: " + capRunes(oneLine(cerr.Message), maxPageString)), nil
	}
	return nil, err
}

// bind returns a context with the chromedp context of c (a tab or the
// browser) that ends with the call.
func (bc *browserCall) bind(c context.Context) context.Context {
	ctx, cancel := context.WithCancel(c)
	if dl, ok := bc.ctx.Deadline(); ok {
		var cancelDL context.CancelFunc
		ctx, cancelDL = context.WithDeadline(ctx, dl)
		bc.done = append(bc.done, cancelDL)
	}
	stop := context.AfterFunc(bc.ctx, cancel)
	bc.done = append(bc.done, func() { stop(); cancel() })
	return ctx
}

// browserCtx is the browser's chromedp context bound to the call.
func (bc *browserCall) browserCtx() context.Context {
	if bc.bctx == nil {
		bc.bctx = bc.bind(bc.st.conn.root)
	}
	return bc.bctx
}

// tabCall is the current tab of a call.
type tabCall struct {
	*browserCall
	tab  target.ID
	ctx  context.Context // the tab's chromedp context bound to the call
	load *tabLoad
}

// tabAt is tab with the element ref or selector names resolved in it (0
// when both are "").
func (bc *browserCall) tabAt(ref, selector string) (*tabCall, cdp.BackendNodeID, error) {
	p, err := bc.tab()
	if err != nil || (ref == "" && selector == "") {
		return p, 0, err
	}
	node, err := p.element(ref, selector)
	return p, node, err
}

// tab returns the tab the tools act on: the current one, else the first
// tab (one is opened if the browser has none).
func (bc *browserCall) tab() (*tabCall, error) {
	tabs, err := bc.st.pageTabs(bc.browserCtx())
	if err != nil {
		return nil, err
	}
	cur := bc.st.current
	if !slices.ContainsFunc(tabs, func(in *target.Info) bool { return in.TargetID == cur }) {
		cur = ""
	}
	if cur == "" && len(tabs) > 0 {
		cur = tabs[0].TargetID
	}
	if cur == "" {
		return bc.newTab()
	}
	return bc.use(cur)
}

// use makes tab id the current one and returns it.
func (bc *browserCall) use(id target.ID) (*tabCall, error) {
	t, err := bc.st.attach(bc.ctx, id)
	if err != nil {
		return nil, err
	}
	if bc.st.current != id {
		// The tab the tools act on is the one shown (a hidden tab gets no
		// animation frames, and the live view shows it).
		if _, err := chromedp.CallBrowser(bc.browserCtx(), target.ActivateTarget, target.ActivateTargetParams{TargetID: id}); err != nil {
			return nil, err
		}
	}
	bc.st.current = id
	p := &tabCall{browserCall: bc, tab: id, ctx: bc.bind(t.ctx), load: t.load}
	// A page an earlier call made load another is waited for.
	p.load.wait(p.ctx, navSettle)
	return p, nil
}

// newTab opens a blank tab and makes it the current one.
func (bc *browserCall) newTab() (*tabCall, error) {
	res, err := chromedp.CallBrowser(bc.browserCtx(), target.CreateTarget, target.CreateTargetParams{URL: "about:blank"})
	if err != nil {
		return nil, err
	}
	if _, err := bc.st.pageTabs(bc.browserCtx()); err != nil {
		return nil, err
	}
	return bc.use(res.TargetID)
}

// summary describes the page: its URL, title, tab and sandbox.
func (p *tabCall) summary() string {
	var b strings.Builder
	if in, err := chromedp.CallBrowser(p.browserCtx(), target.GetTargetInfo, target.GetTargetInfoParams{TargetID: p.tab}); err == nil && in.TargetInfo != nil {
		fmt.Fprintf(&b, "url: %s\ntitle: %s\n", capRunes(oneLine(in.TargetInfo.URL), maxPageString), capRunes(oneLine(in.TargetInfo.Title), maxPageString))
	}
	fmt.Fprintf(&b, "tab: %d\nsandbox_id: %s", slices.Index(p.st.order, p.tab), p.id)
	return b.String()
}

// result is a text result: what happened, notes, then the summary.
func (p *tabCall) result(what string, notes []string) *sdk.CallToolResult {
	var b strings.Builder
	b.WriteString(what + "\n")
	for _, n := range notes {
		b.WriteString(n + "\n")
	}
	b.WriteString(p.summary())
	return textResult(b.String())
}

// element resolves a ref of the tab's last snapshot or a CSS selector to
// the element's DOM node.
func (p *tabCall) element(ref, selector string) (cdp.BackendNodeID, error) {
	if ref != "" {
		stale := fmt.Errorf("%w: ref %s is not in the last browser_snapshot of this tab (the page changed, or the ref is of another tab): take a new browser_snapshot", errdefs.ErrInvalid, ref)
		r := p.st.refs[p.tab]
		if r == nil || r.last[ref] == 0 {
			return 0, stale
		}
		gone := fmt.Errorf("%w: element %s is gone from the page (it changed or loaded another): take a new browser_snapshot", errdefs.ErrInvalid, ref)
		if loader, err := p.loader(); err != nil {
			return 0, err
		} else if loader != r.loader {
			return 0, gone
		}
		node := r.last[ref]
		ok, err := chromedp.Run(p.ctx, func(ctx context.Context, tg *chromedp.Target) (bool, error) {
			return callOn[bool](ctx, tg, node, "function() { return this.isConnected }")
		})
		if err != nil && p.ctx.Err() == nil && errors.As(err, new(*cdproto.Error)) {
			return 0, gone
		}
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, gone
		}
		return node, nil
	}
	lit, _ := json.Marshal(selector)
	res, err := chromedp.Call(p.ctx, runtime.Evaluate, runtime.EvaluateParams{
		Expression: "document.querySelector(" + string(lit) + ")", ObjectGroup: "airlock",
	})
	if err != nil {
		return 0, err
	}
	defer func() {
		_, _ = chromedp.Call(p.ctx, runtime.ReleaseObjectGroup, runtime.ReleaseObjectGroupParams{ObjectGroup: "airlock"})
	}()
	if res.ExceptionDetails != nil {
		return 0, fmt.Errorf("%w: selector %q: %s", errdefs.ErrInvalid, capRunes(selector, 100), capRunes(oneLine((&chromedp.ExceptionError{ExceptionDetails: res.ExceptionDetails}).Error()), maxPageString))
	}
	if res.Result == nil || res.Result.ObjectID == "" {
		return 0, fmt.Errorf("%w: no element matches selector %q (browser_snapshot shows the page)", errdefs.ErrNotFound, capRunes(selector, 100))
	}
	n, err := chromedp.Call(p.ctx, dom.DescribeNode, dom.DescribeNodeParams{ObjectID: res.Result.ObjectID})
	if err != nil {
		return 0, err
	}
	return n.Node.BackendNodeID, nil
}

// loader is the loader of the tab's document: a new one for each
// document the tab loads.
func (p *tabCall) loader() (cdp.LoaderID, error) {
	ft, err := chromedp.Call(p.ctx, page.GetFrameTree, cdp.Empty{})
	if err != nil {
		return "", err
	}
	if ft.FrameTree == nil || ft.FrameTree.Frame == nil {
		return "", errors.New("the tab has no frame")
	}
	return ft.FrameTree.Frame.LoaderID, nil
}

// label names an element in a result.
func label(ref, selector string) string {
	if ref != "" {
		return ref
	}
	return strconv.Quote(capRunes(selector, 100))
}

// interact runs act on the tab and, if it made the tab's page load
// another, waits (at most navSettle) for it. JavaScript dialogs the page
// opens meanwhile are accepted, so that they cannot hang the call; the
// notes say so, and name tabs the page opened.
func (p *tabCall) interact(act chromedp.Action[chromedp.Void]) ([]string, error) {
	lctx, lcancel := context.WithCancel(p.ctx)
	defer lcancel()
	var (
		mu      sync.Mutex
		notes   []string
		dialogs = make(chan *page.EventJavascriptDialogOpening, 8)
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if len(notes) < maxNotes {
			notes = append(notes, s)
		}
	}
	err := chromedp.Listen(lctx, func(ev any) {
		switch e := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			select {
			case dialogs <- e:
			default:
			}
		case *target.EventTargetCreated:
			if in := e.TargetInfo; in != nil && in.Type == "page" && in.OpenerID == p.tab {
				note("the page opened a new tab (see browser_tabs; browser_tab_switch to use it): " + capRunes(oneLine(in.URL), maxPageString))
			}
		}
	})
	if err != nil {
		return nil, err
	}
	accept := func(d *page.EventJavascriptDialogOpening) {
		if _, err := chromedp.Call(lctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true, PromptText: d.DefaultPrompt}); err == nil {
			note(fmt.Sprintf("a JavaScript %s dialog said %q and was accepted", d.Type, capRunes(oneLine(d.Message), maxPageString)))
		}
	}
	wg.Go(func() {
		for {
			select {
			case d := <-dialogs:
				accept(d)
			case <-stop:
				for {
					select {
					case d := <-dialogs:
						accept(d)
					default:
						return
					}
				}
			case <-lctx.Done():
				return
			}
		}
	})
	finish := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer finish()
	if _, err := chromedp.Run(p.ctx, act); err != nil {
		return nil, err
	}
	// A round trip to the page: the events the page sent while it took
	// the input (a navigation it requested) are in by its answer.
	if _, err := chromedp.Call(p.ctx, runtime.Evaluate, runtime.EvaluateParams{Expression: "0"}); err != nil && p.ctx.Err() != nil {
		return nil, err
	}
	if _, loading := p.load.wait(p.ctx, navSettle); loading && p.ctx.Err() == nil {
		note(fmt.Sprintf("the page was still loading after %s", navSettle))
	}
	finish()
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(notes), nil
}
