package mcp

import (
	"context"
	"fmt"
	"slices"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// tabView is a tab as browser_tabs shows it.
type tabView struct {
	Index   int    `json:"index"`
	ID      string `json:"id"`
	Title   string `json:"title"`
	URL     string `json:"url"`
	Current bool   `json:"current,omitempty"`
}

func (t *tools) browserTabs(ctx context.Context, in browserIn) (*sdk.CallToolResult, error) {
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		tabs, err := bc.st.pageTabs(bc.browserCtx())
		if err != nil {
			return nil, err
		}
		// Without a current tab (none yet, or it closed), the tools take
		// the first.
		cur := bc.st.current
		if len(tabs) > 0 && !slices.ContainsFunc(tabs, func(in *target.Info) bool { return in.TargetID == cur }) {
			cur = tabs[0].TargetID
		}
		views := []tabView{}
		for i, in := range tabs {
			views = append(views, tabView{i, string(in.TargetID), capRunes(oneLine(in.Title), maxPageString), capRunes(oneLine(in.URL), maxPageString), in.TargetID == cur})
		}
		return jsonResult(map[string]any{"sandbox_id": bc.id, "tabs": views})
	})
}

type tabIn struct {
	browserIn
	Index *int   `json:"index,omitempty" jsonschema:"the tab's index in browser_tabs"`
	ID    string `json:"id,omitempty" jsonschema:"the tab's id in browser_tabs, instead of index"`
}

// find returns the tab in names among tabs (the current one if it names
// none and current is allowed).
func (in tabIn) find(tabs []*target.Info, current target.ID, orCurrent bool) (target.ID, error) {
	switch {
	case in.Index != nil && in.ID != "":
		return "", fmt.Errorf("%w: give index or id, not both", errdefs.ErrInvalid)
	case in.Index != nil:
		if *in.Index < 0 || *in.Index >= len(tabs) {
			return "", fmt.Errorf("%w: no tab %d: the browser has %d tabs (see browser_tabs)", errdefs.ErrNotFound, *in.Index, len(tabs))
		}
		return tabs[*in.Index].TargetID, nil
	case in.ID != "":
		for _, t := range tabs {
			if string(t.TargetID) == in.ID {
				return t.TargetID, nil
			}
		}
		return "", fmt.Errorf("%w: no tab with id %q (see browser_tabs)", errdefs.ErrNotFound, capRunes(in.ID, 64))
	case orCurrent && current != "":
		return current, nil
	}
	return "", fmt.Errorf("%w: give the tab's index or id (see browser_tabs)", errdefs.ErrInvalid)
}

func (t *tools) browserTabSwitch(ctx context.Context, in tabIn) (*sdk.CallToolResult, error) {
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		tabs, err := bc.st.pageTabs(bc.browserCtx())
		if err != nil {
			return nil, err
		}
		id, err := in.find(tabs, "", false)
		if err != nil {
			return nil, err
		}
		p, err := bc.use(id)
		if err != nil {
			return nil, err
		}
		return p.result("switched to the tab", nil), nil
	})
}

type tabNewIn struct {
	browserIn
	URL string `json:"url,omitempty" jsonschema:"a URL to load in it (default: about:blank)"`
}

func (t *tools) browserTabNew(ctx context.Context, in tabNewIn) (*sdk.CallToolResult, error) {
	u := ""
	if in.URL != "" {
		var err error
		if u, err = checkURL(in.URL, navigateSchemes...); err != nil {
			return nil, err
		}
	}
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		p, err := bc.newTab()
		if err != nil {
			return nil, err
		}
		if u == "" {
			return p.result("opened a new tab", nil), nil
		}
		notes, err := p.interact(chromedp.Navigate(u))
		if err != nil {
			return nil, err
		}
		return p.result("opened a new tab", notes), nil
	})
}

func (t *tools) browserTabClose(ctx context.Context, in tabIn) (*sdk.CallToolResult, error) {
	return t.browser(ctx, in.SandboxID, 0, func(bc *browserCall) (*sdk.CallToolResult, error) {
		tabs, err := bc.st.pageTabs(bc.browserCtx())
		if err != nil {
			return nil, err
		}
		id, err := in.find(tabs, bc.st.current, true)
		if err != nil {
			return nil, err
		}
		// The browser answers before the tab is gone: wait for that.
		ctx := bc.browserCtx()
		gone := make(chan struct{})
		closed := false // the listener's own
		if err := chromedp.ListenBrowser(ctx, func(ev any) {
			if e, ok := ev.(*target.EventTargetDestroyed); ok && e.TargetID == id && !closed {
				closed = true
				close(gone)
			}
		}); err != nil {
			return nil, err
		}
		if _, err := chromedp.CallBrowser(ctx, target.CloseTarget, target.CloseTargetParams{TargetID: id}); err != nil {
			return nil, err
		}
		bc.st.detach(id)
		select {
		case <-gone:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return textResult(fmt.Sprintf("closed tab %s (%d tabs left; the tools now act on the first, or browser_tab_switch)\nsandbox_id: %s", id, len(tabs)-1, bc.id)), nil
	})
}
