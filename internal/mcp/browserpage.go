package mcp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The tools that act on the current tab's page.

// checkURL validates a URL to load: http, https, file, data or about.
func checkURL(s string, schemes ...string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxURLBytes || strings.IndexByte(s, 0) >= 0 {
		return "", fmt.Errorf("%w: url must be a URL of at most %d bytes", errdefs.ErrInvalid, maxURLBytes)
	}
	u, err := url.Parse(s)
	if err != nil || !slices.Contains(schemes, strings.ToLower(u.Scheme)) {
		return "", fmt.Errorf("%w: url %q: give a URL with one of the schemes %s (e.g. https://example.com/)", errdefs.ErrInvalid, capRunes(s, 100), strings.Join(schemes, ", "))
	}
	return s, nil
}

var navigateSchemes = []string{"http", "https", "file", "data", "about"}

type navigateIn struct {
	browserIn
	URL      string `json:"url" jsonschema:"the URL to load: http, https, file (a file inside the sandbox), data or about:blank"`
	TimeoutS int    `json:"timeout_s,omitempty" jsonschema:"give up after this many seconds (default 60; starting the browser on first use does not count)"`
}

func (t *tools) browserNavigate(ctx context.Context, in navigateIn) (*sdk.CallToolResult, error) {
	u, err := checkURL(in.URL, navigateSchemes...)
	if err != nil {
		return nil, err
	}
	return t.browser(ctx, in.SandboxID, in.TimeoutS, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, err := bc.tab()
		if err != nil {
			return nil, err
		}
		var resp *network.Response
		notes, err := p.interact(func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			var err error
			resp, err = chromedp.NavigateResponse(u)(ctx, tg)
			return chromedp.Void{}, err
		})
		if err != nil {
			return nil, err
		}
		what := "loaded"
		if resp != nil && resp.Status != 0 {
			what = fmt.Sprintf("loaded (HTTP %d)", resp.Status)
		}
		return p.result(what, notes), nil
	})
}

type browserSnapshotIn struct {
	browserIn
	Ref string `json:"ref,omitempty" jsonschema:"only this element's part of the page (a ref of an earlier snapshot)"`
}

func (t *tools) browserSnapshot(ctx context.Context, in browserSnapshotIn) (*sdk.CallToolResult, error) {
	var ref string
	if in.Ref != "" {
		var err error
		if ref, err = parseRef(in.Ref); err != nil {
			return nil, err
		}
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, root, err := bc.tabAt(ref, "")
		if err != nil {
			return nil, err
		}
		loader, err := p.loader()
		if err != nil {
			return nil, err
		}
		tree, err := chromedp.Call(p.ctx, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
		if err != nil {
			return nil, err
		}
		refs := p.st.tabRefs(p.tab)
		if refs.loader != loader { // a new document: none of its nodes has a ref
			refs.loader, refs.last = loader, nil
			clear(refs.byNode)
		}
		shown := map[string]cdp.BackendNodeID{}
		head := p.summary() + "\n\n"
		limit := max(t.h.cfg.MaxOutputBytes-len(head)-200, 1024)
		text, omitted := renderAX(tree.Nodes, root, limit, func(n cdp.BackendNodeID) string {
			r := p.st.refFor(refs, n)
			shown[r] = n
			return r
		})
		if ref != "" {
			if text == "" && omitted == 0 {
				return nil, fmt.Errorf("%w: element %s has no part in the page's accessibility tree (hidden?)", errdefs.ErrNotFound, ref)
			}
			maps := refs.last // a part: the refs of the rest stay good
			if maps == nil {
				maps = map[string]cdp.BackendNodeID{}
			}
			for r, n := range shown {
				maps[r] = n
			}
			shown = maps
		}
		refs.last = shown
		if omitted > 0 {
			text += fmt.Sprintf("[snapshot cut: %d more lines not shown (results are capped at %d bytes): snapshot a part with ref, or read text with browser_text]\n", omitted, t.h.cfg.MaxOutputBytes)
		}
		return textResult(head + text), nil
	})
}

type clickIn struct {
	browserIn
	elementIn
	Double bool `json:"double,omitempty" jsonschema:"double-click"`
}

func (t *tools) browserClick(ctx context.Context, in clickIn) (*sdk.CallToolResult, error) {
	ref, sel, err := in.check(false)
	if err != nil {
		return nil, err
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, node, err := bc.tabAt(ref, sel)
		if err != nil {
			return nil, err
		}
		clicks := 1
		if in.Double {
			clicks = 2
		}
		notes, err := p.interact(func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			x, y, err := nodeCenter(ctx, tg, node)
			if err != nil {
				return chromedp.Void{}, err
			}
			if _, err := chromedp.MouseEvent(chromedp.MouseMoved, x, y)(ctx, tg); err != nil {
				return chromedp.Void{}, err
			}
			for i := 1; i <= clicks; i++ {
				if _, err := chromedp.MouseClickXY(x, y, chromedp.ClickCount(i))(ctx, tg); err != nil {
					return chromedp.Void{}, err
				}
			}
			return chromedp.Void{}, nil
		})
		if err != nil {
			return nil, err
		}
		return p.result("clicked "+label(ref, sel), notes), nil
	})
}

// nodeCenter scrolls node into view and returns the center of its first
// box in the viewport.
func nodeCenter(ctx context.Context, tg *chromedp.Target, node cdp.BackendNodeID) (x, y float64, err error) {
	notVisible := fmt.Errorf("%w: the element is not visible (it has no box on the page)", errdefs.ErrFailedPrecondition)
	if _, err := cdp.Call(ctx, tg, dom.ScrollIntoViewIfNeeded, dom.ScrollIntoViewIfNeededParams{BackendNodeID: node}); err != nil {
		if errors.As(err, new(*cdproto.Error)) {
			return 0, 0, notVisible
		}
		return 0, 0, err
	}
	q, err := cdp.Call(ctx, tg, dom.GetContentQuads, dom.GetContentQuadsParams{BackendNodeID: node})
	if err != nil {
		return 0, 0, err
	}
	if len(q.Quads) == 0 || len(q.Quads[0]) != 8 {
		return 0, 0, notVisible
	}
	for i := 0; i < 8; i += 2 {
		x += q.Quads[0][i] / 4
		y += q.Quads[0][i+1] / 4
	}
	return x, y, nil
}

type typeIn struct {
	browserIn
	elementIn
	Text   string `json:"text" jsonschema:"the text to type"`
	Append bool   `json:"append,omitempty" jsonschema:"type after the field's text (default: replace it)"`
	Submit bool   `json:"submit,omitempty" jsonschema:"press Enter after typing"`
}

// selectContentsJS selects the text of a field, or of any other element.
const selectContentsJS = `function() {
	if (this instanceof HTMLInputElement || this instanceof HTMLTextAreaElement) { this.select(); return; }
	const r = document.createRange(); r.selectNodeContents(this);
	const s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
}`

func (t *tools) browserType(ctx context.Context, in typeIn) (*sdk.CallToolResult, error) {
	ref, sel, err := in.check(false)
	if err != nil {
		return nil, err
	}
	if len(in.Text) > maxTypeBytes || !utf8.ValidString(in.Text) {
		return nil, fmt.Errorf("%w: text must be UTF-8 of at most %d bytes", errdefs.ErrInvalid, maxTypeBytes)
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, node, err := bc.tabAt(ref, sel)
		if err != nil {
			return nil, err
		}
		notes, err := p.interact(func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			if _, err := cdp.Call(ctx, tg, dom.Focus, dom.FocusParams{BackendNodeID: node}); err != nil {
				if errors.As(err, new(*cdproto.Error)) {
					return chromedp.Void{}, fmt.Errorf("%w: the element cannot take the focus (not a field?)", errdefs.ErrFailedPrecondition)
				}
				return chromedp.Void{}, err
			}
			if !in.Append {
				if _, err := callOn[any](ctx, tg, node, selectContentsJS); err != nil {
					return chromedp.Void{}, err
				}
				if in.Text == "" {
					if _, err := chromedp.KeyEvent(kb.Backspace)(ctx, tg); err != nil {
						return chromedp.Void{}, err
					}
				}
			}
			if in.Text != "" {
				if _, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: in.Text}); err != nil {
					return chromedp.Void{}, err
				}
			}
			if in.Submit {
				return chromedp.KeyEvent(kb.Enter)(ctx, tg)
			}
			return chromedp.Void{}, nil
		})
		if err != nil {
			return nil, err
		}
		what := fmt.Sprintf("typed %d characters into %s", utf8.RuneCountInString(in.Text), label(ref, sel))
		if in.Submit {
			what += " and pressed Enter"
		}
		return p.result(what, notes), nil
	})
}

// callOn calls the JavaScript function fn with node as this and returns
// its value.
func callOn[T any](ctx context.Context, tg *chromedp.Target, node cdp.BackendNodeID, fn string) (T, error) {
	var v T
	obj, err := cdp.Call(ctx, tg, dom.ResolveNode, dom.ResolveNodeParams{BackendNodeID: node, ObjectGroup: "airlock"})
	if err != nil {
		return v, err
	}
	defer func() {
		_, _ = cdp.Call(ctx, tg, runtime.ReleaseObjectGroup, runtime.ReleaseObjectGroupParams{ObjectGroup: "airlock"})
	}()
	res, err := cdp.Call(ctx, tg, runtime.CallFunctionOn, runtime.CallFunctionOnParams{FunctionDeclaration: fn, ObjectID: obj.Object.ObjectID, ReturnByValue: new(true)})
	if err != nil {
		return v, err
	}
	if res.ExceptionDetails != nil {
		return v, &chromedp.ExceptionError{ExceptionDetails: res.ExceptionDetails}
	}
	if res.Result != nil && len(res.Result.Value) > 0 {
		if err := json.Unmarshal(res.Result.Value, &v); err != nil {
			return v, fmt.Errorf("the page's answer: %w", err)
		}
	}
	return v, nil
}

type pressIn struct {
	browserIn
	Key      string `json:"key" jsonschema:"a key, optionally with modifiers: Enter, Tab, Escape, Backspace, ArrowDown, PageDown, Home, F5, a, Control+A, Shift+Tab, Alt+ArrowLeft"`
	Ref      string `json:"ref,omitempty" jsonschema:"focus this element first (a ref of browser_snapshot)"`
	Selector string `json:"selector,omitempty" jsonschema:"focus the element of this CSS selector first, instead of ref"`
}

func (t *tools) browserPress(ctx context.Context, in pressIn) (*sdk.CallToolResult, error) {
	r, mods, err := parseKey(in.Key)
	if err != nil {
		return nil, err
	}
	ref, sel, err := elementIn{in.Ref, in.Selector}.check(true)
	if err != nil {
		return nil, err
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, node, err := bc.tabAt(ref, sel)
		if err != nil {
			return nil, err
		}
		notes, err := p.interact(func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			if node != 0 {
				if _, err := cdp.Call(ctx, tg, dom.Focus, dom.FocusParams{BackendNodeID: node}); err != nil {
					return chromedp.Void{}, err
				}
			}
			return chromedp.KeyEvent(string(r), chromedp.KeyModifiers(mods...))(ctx, tg)
		})
		if err != nil {
			return nil, err
		}
		return p.result("pressed "+in.Key, notes), nil
	})
}

type scrollIn struct {
	browserIn
	elementIn
	DX int `json:"dx,omitempty" jsonschema:"pixels to scroll right (negative: left)"`
	DY int `json:"dy,omitempty" jsonschema:"pixels to scroll down (negative: up)"`
}

func (t *tools) browserScroll(ctx context.Context, in scrollIn) (*sdk.CallToolResult, error) {
	ref, sel, err := in.check(true)
	if err != nil {
		return nil, err
	}
	if in.DX < -maxScroll || in.DX > maxScroll || in.DY < -maxScroll || in.DY > maxScroll {
		return nil, fmt.Errorf("%w: dx and dy must be between %d and %d", errdefs.ErrInvalid, -maxScroll, maxScroll)
	}
	if in.DX == 0 && in.DY == 0 && ref == "" && sel == "" {
		return nil, fmt.Errorf("%w: give dy (pixels down; negative scrolls up), dx, or an element (ref or selector) to scroll into view", errdefs.ErrInvalid)
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, node, err := bc.tabAt(ref, sel)
		if err != nil {
			return nil, err
		}
		what := fmt.Sprintf("scrolled by dx=%d dy=%d", in.DX, in.DY)
		if node != 0 {
			what = "scrolled " + label(ref, sel) + " into view"
			if in.DX != 0 || in.DY != 0 {
				what += fmt.Sprintf(", then by dx=%d dy=%d over it", in.DX, in.DY)
			}
		}
		_, err = chromedp.Run(p.ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			var x, y float64
			if node != 0 {
				var err error
				if x, y, err = nodeCenter(ctx, tg, node); err != nil {
					return chromedp.Void{}, err
				}
			} else {
				m, err := cdp.Call(ctx, tg, page.GetLayoutMetrics, cdp.Empty{})
				if err != nil {
					return chromedp.Void{}, err
				}
				if v := m.CSSLayoutViewport; v != nil {
					x, y = float64(v.ClientWidth)/2, float64(v.ClientHeight)/2
				}
			}
			if in.DX == 0 && in.DY == 0 {
				return chromedp.Void{}, nil
			}
			// A wheel over the element (or the middle of the window)
			// scrolls what a person's would: the page or the box under it.
			_, err := cdp.Call(ctx, tg, mouseWheel, mouseWheelParams{
				Type: input.DispatchMouseEventTypeMouseWheel, X: x, Y: y, DeltaX: float64(in.DX), DeltaY: float64(in.DY),
			})
			return chromedp.Void{}, err
		})
		if err != nil {
			return nil, err
		}
		return p.result(what, nil), nil
	})
}

// mouseWheel is Input.dispatchMouseEvent for a wheel event: cdproto's
// DispatchMouseEventParams leaves out a zero deltaX or deltaY, which
// Chromium requires of a mouseWheel event.
var mouseWheel = cdp.Command[mouseWheelParams, cdp.Empty]{Method: input.CommandDispatchMouseEvent}

type mouseWheelParams struct {
	Type   input.DispatchMouseEventType `json:"type"`
	X      float64                      `json:"x"`
	Y      float64                      `json:"y"`
	DeltaX float64                      `json:"deltaX"`
	DeltaY float64                      `json:"deltaY"`
}

type textIn struct {
	browserIn
	elementIn
}

// pageTextJS returns up to max characters of the text of this (an
// element) and the length of all of it.
const pageTextJS = `function(max) {
	const t = String(this.innerText ?? this.textContent ?? "");
	return {text: t.slice(0, max), length: t.length};
}`

func (t *tools) browserText(ctx context.Context, in textIn) (*sdk.CallToolResult, error) {
	ref, sel, err := in.check(true)
	if err != nil {
		return nil, err
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, node, err := bc.tabAt(ref, sel)
		if err != nil {
			return nil, err
		}
		head := p.summary() + "\n\n"
		limit := max(t.h.cfg.MaxOutputBytes-len(head)-200, 1024)
		var out struct {
			Text   string `json:"text"`
			Length int    `json:"length"`
		}
		_, err = chromedp.Run(p.ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			var obj runtime.RemoteObjectID
			if node != 0 {
				r, err := cdp.Call(ctx, tg, dom.ResolveNode, dom.ResolveNodeParams{BackendNodeID: node, ObjectGroup: "airlock"})
				if err != nil {
					return chromedp.Void{}, err
				}
				obj = r.Object.ObjectID
			} else {
				r, err := cdp.Call(ctx, tg, runtime.Evaluate, runtime.EvaluateParams{Expression: "document.body || document.documentElement", ObjectGroup: "airlock"})
				if err != nil {
					return chromedp.Void{}, err
				}
				if r.Result == nil || r.Result.ObjectID == "" {
					return chromedp.Void{}, nil // no document
				}
				obj = r.Result.ObjectID
			}
			defer func() {
				_, _ = cdp.Call(ctx, tg, runtime.ReleaseObjectGroup, runtime.ReleaseObjectGroupParams{ObjectGroup: "airlock"})
			}()
			arg, _ := json.Marshal(limit)
			res, err := cdp.Call(ctx, tg, runtime.CallFunctionOn, runtime.CallFunctionOnParams{
				FunctionDeclaration: pageTextJS, ObjectID: obj, ReturnByValue: new(true),
				Arguments: []*runtime.CallArgument{{Value: arg}},
			})
			if err != nil {
				return chromedp.Void{}, err
			}
			if res.ExceptionDetails != nil {
				return chromedp.Void{}, &chromedp.ExceptionError{ExceptionDetails: res.ExceptionDetails}
			}
			if res.Result != nil && len(res.Result.Value) > 0 {
				if err := json.Unmarshal(res.Result.Value, &out); err != nil {
					return chromedp.Void{}, fmt.Errorf("the page's text: %w", err)
				}
			}
			return chromedp.Void{}, nil
		})
		if err != nil {
			return nil, err
		}
		text := strings.ToValidUTF8(out.Text, "\uFFFD")
		shown := utf8.RuneCountInString(text)
		if len(text) > limit {
			text = cutUTF8(text, limit)
			shown = utf8.RuneCountInString(text)
		}
		if shown < out.Length {
			text += fmt.Sprintf("\n[text cut: %d of %d characters shown (results are capped at %d bytes): read a part with selector or ref]", shown, out.Length, t.h.cfg.MaxOutputBytes)
		}
		return textResult(head + text), nil
	})
}

// cutUTF8 cuts s to at most n bytes on a character boundary.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

type screenshotIn struct {
	browserIn
	FullPage bool `json:"full_page,omitempty" jsonschema:"the whole page, not only the window"`
}

func (t *tools) browserScreenshot(ctx context.Context, in screenshotIn) (*sdk.CallToolResult, error) {
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, err := bc.tab()
		if err != nil {
			return nil, err
		}
		shot := chromedp.CaptureScreenshot()
		if in.FullPage {
			shot = chromedp.FullScreenshot(100)
		}
		png, err := chromedp.Run(p.ctx, shot)
		if err != nil {
			return nil, err
		}
		if len(png) > maxScreenshotBytes {
			return errorResult(fmt.Sprintf("the screenshot is %d bytes, over the cap of %d: take the window only (no full_page)", len(png), maxScreenshotBytes)), nil
		}
		what := "screenshot"
		if w, h, ok := pngSize(png); ok {
			what = fmt.Sprintf("screenshot, %dx%d PNG", w, h)
		}
		res := p.result(what, nil)
		res.Content = append(res.Content, &sdk.ImageContent{Data: png, MIMEType: "image/png"})
		return res, nil
	})
}

// pngSize reads the width and height of a PNG's header.
func pngSize(b []byte) (w, h uint32, ok bool) {
	if len(b) < 24 || string(b[1:4]) != "PNG" || string(b[12:16]) != "IHDR" {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[16:20]), binary.BigEndian.Uint32(b[20:24]), true
}

type evalIn struct {
	browserIn
	Expression string `json:"expression" jsonschema:"a JavaScript expression, run in the page (a promise is awaited), e.g. document.title or [...document.links].map(a => a.href)"`
}

func (t *tools) browserEval(ctx context.Context, in evalIn) (*sdk.CallToolResult, error) {
	if strings.TrimSpace(in.Expression) == "" || len(in.Expression) > maxExpressionBytes {
		return nil, fmt.Errorf("%w: expression must be JavaScript of 1 to %d bytes", errdefs.ErrInvalid, maxExpressionBytes)
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, err := bc.tab()
		if err != nil {
			return nil, err
		}
		var obj *runtime.RemoteObject
		notes, err := p.interact(func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			res, err := cdp.Call(ctx, tg, runtime.Evaluate, runtime.EvaluateParams{
				Expression: in.Expression, ReturnByValue: new(true), AwaitPromise: new(true), UserGesture: new(true),
			})
			if err != nil {
				return chromedp.Void{}, err
			}
			if res.ExceptionDetails != nil {
				return chromedp.Void{}, &chromedp.ExceptionError{ExceptionDetails: res.ExceptionDetails}
			}
			obj = res.Result
			return chromedp.Void{}, nil
		})
		if err != nil {
			return nil, err
		}
		val := evalText(obj)
		limit := max(t.h.cfg.MaxOutputBytes-1024, 1024)
		if len(val) > limit {
			val = cutUTF8(val, limit) + fmt.Sprintf("\n[result cut: %d of %d bytes shown]", limit, len(val))
		}
		return p.result(val, notes), nil
	})
}

// evalText is a JavaScript value as text: its JSON, or its description.
func evalText(obj *runtime.RemoteObject) string {
	switch {
	case obj == nil || obj.Type == runtime.RemoteObjectTypeUndefined:
		return "undefined"
	case obj.UnserializableValue != "":
		return string(obj.UnserializableValue)
	case len(obj.Value) > 0:
		return strings.ToValidUTF8(string(obj.Value), "\uFFFD")
	case obj.Description != "":
		return strings.ToValidUTF8(obj.Description, "\uFFFD")
	}
	return string(obj.Type)
}
