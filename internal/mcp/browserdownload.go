package mcp

import (
	"context"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

// browserDownloadDir is where the sandbox's Chromium saves downloads (the
// home of the user it runs as); tests point it elsewhere.
var browserDownloadDir = "/home/browser/Downloads"

// downloadsTo makes the browser save downloads (browser_download's, and
// those of links the page follows) in dir, with download events.
func (bc *browserCall) downloadsTo(dir string) error {
	_, err := chromedp.CallBrowser(bc.browserCtx(), browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dir, EventsEnabled: new(true),
	})
	return err
}

type downloadIn struct {
	browserIn
	URL      string `json:"url" jsonschema:"the http or https URL of the file"`
	Path     string `json:"path,omitempty" jsonschema:"where to save it inside the sandbox, an absolute file path (default: /home/browser/Downloads/ with the name the server gives)"`
	TimeoutS int    `json:"timeout_s,omitempty" jsonschema:"give up after this many seconds (default 60; starting the browser on first use does not count)"`
}

// downloadResult is what browser_download answers.
type downloadResult struct {
	Path      string `json:"path"`
	Size      int64  `json:"size"`
	URL       string `json:"url"`
	SandboxID string `json:"sandbox_id"`
}

func (t *tools) browserDownload(ctx context.Context, in downloadIn) (*sdk.CallToolResult, error) {
	u, err := checkURL(in.URL, "http", "https")
	if err != nil {
		return nil, err
	}
	dest := ""
	if in.Path != "" {
		if dest, err = guestPath(in.Path); err != nil {
			return nil, err
		}
		if dest == "/" {
			return nil, fmt.Errorf("%w: path must name a file", errdefs.ErrInvalid)
		}
	}
	return t.browser(ctx, in.SandboxID, in.TimeoutS, func(bc *browserCall) (*sdk.CallToolResult, error) {
		file, size, res, err := bc.download(u)
		if res != nil || err != nil {
			return res, err
		}
		if dest != "" && dest != file {
			if fail, err := bc.move(file, dest); fail != nil || err != nil {
				return fail, err
			}
			file = dest
		}
		return jsonResult(downloadResult{Path: file, Size: size, URL: capRunes(u, maxPageString), SandboxID: bc.id})
	})
}

// download has the browser download u in a tab of its own (closed after)
// and returns the file's path inside the sandbox and its size, or an
// error result (or an error). The tab's document response is made an attachment (the
// Fetch domain), so the browser saves what it would show.
func (bc *browserCall) download(u string) (string, int64, *sdk.CallToolResult, error) {
	created, err := chromedp.CallBrowser(bc.browserCtx(), target.CreateTarget, target.CreateTargetParams{URL: "about:blank", Background: new(true)})
	if err != nil {
		return "", 0, nil, err
	}
	// Cancelling tctx closes the tab.
	tctx, tcancel := chromedp.NewContext(bc.st.conn.root, chromedp.WithTargetID(created.TargetID))
	defer tcancel()
	stop := context.AfterFunc(bc.ctx, tcancel)
	err = chromedp.Do(tctx)
	stop()
	if err != nil {
		return "", 0, nil, err
	}
	ctx := bc.bind(tctx)
	lctx, lcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer lcancel()

	frame := cdp.FrameID(created.TargetID)
	begun := make(chan *browser.EventDownloadWillBegin, 1)
	ended := make(chan *browser.EventDownloadProgress, 1)
	var guid string // the listener's own
	if err := chromedp.ListenBrowser(lctx, func(ev any) {
		switch e := ev.(type) {
		case *browser.EventDownloadWillBegin:
			if guid == "" && e.FrameID == frame {
				guid = e.GUID
				begun <- e
			}
		case *browser.EventDownloadProgress:
			if guid != "" && e.GUID == guid && e.State != browser.DownloadProgressStateInProgress {
				select {
				case ended <- e:
				default:
				}
			}
		}
	}); err != nil {
		return "", 0, nil, err
	}
	refused := make(chan string, 1)
	paused := chromedp.Events(lctx, fetch.RequestPaused)
	wg.Go(func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			if why := answerPaused(lctx, ev); why != "" {
				// Told before the request fails, so that the navigation's
				// failure finds it.
				select {
				case refused <- why:
				default:
				}
				_, _ = chromedp.Call(lctx, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: network.ErrorReasonFailed})
			}
		}
	})
	if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{
		{URLPattern: "*", ResourceType: network.ResourceTypeDocument, RequestStage: fetch.RequestStageResponse},
	}}); err != nil {
		return "", 0, nil, err
	}
	nav, err := chromedp.Call(ctx, page.Navigate, page.NavigateParams{URL: u})
	if err != nil {
		return "", 0, nil, err
	}
	// A download ends the tab's navigation as aborted.
	if nav.ErrorText != "" && nav.ErrorText != "net::ERR_ABORTED" {
		why := capRunes(oneLine(nav.ErrorText), maxPageString)
		select {
		case why = <-refused:
		default:
		}
		return "", 0, errorResult("the download did not start: " + why), nil
	}
	var begin *browser.EventDownloadWillBegin
	select {
	case begin = <-begun:
	case why := <-refused:
		return "", 0, errorResult("the download did not start: " + why), nil
	case <-ctx.Done():
		return "", 0, errorResult(fmt.Sprintf("the download did not start in %s (raise timeout_s)", bc.d)), nil
	}
	select {
	case e := <-ended:
		if e.State != browser.DownloadProgressStateCompleted {
			return "", 0, errorResult("the download was cancelled"), nil
		}
		file, ok := downloadedFile(e.FilePath, begin.SuggestedFilename)
		if !ok {
			return "", 0, errorResult(fmt.Sprintf("the browser saved the download where it should not (%q)", capRunes(e.FilePath, 200))), nil
		}
		return file, int64(e.ReceivedBytes), nil, nil
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(bc.st.conn.root, 5*time.Second)
		defer cancel()
		_, _ = chromedp.CallBrowser(cctx, browser.CancelDownload, browser.CancelDownloadParams{GUID: begin.GUID})
		return "", 0, errorResult(fmt.Sprintf("the download did not finish in %s and was cancelled (raise timeout_s)", bc.d)), nil
	}
}

// answerPaused lets the tab's paused document response go on, made an
// attachment, or returns why the download cannot start (an HTTP error, no
// content): the caller then fails the request.
func answerPaused(ctx context.Context, ev fetch.EventRequestPaused) string {
	code := ev.ResponseStatusCode
	switch {
	case ev.ResponseErrorReason != "" || code >= 300 && code < 400:
		// A network error fails the navigation; a redirect is followed.
		_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		return ""
	case code >= 400 || code == 204 || code == 205:
		return fmt.Sprintf("the server answered HTTP %d", code)
	}
	_, _ = chromedp.Call(ctx, fetch.ContinueResponse, fetch.ContinueResponseParams{
		RequestID: ev.RequestID, ResponseCode: code, ResponseHeaders: attachment(ev.ResponseHeaders),
	})
	return ""
}

// attachment is headers with the Content-Disposition of an attachment
// (keeping its file name, if any).
func attachment(headers []*fetch.HeaderEntry) []*fetch.HeaderEntry {
	disp := "attachment"
	var out []*fetch.HeaderEntry
	for _, h := range headers {
		if h == nil {
			continue
		}
		if strings.EqualFold(h.Name, "Content-Disposition") {
			if _, params, ok := strings.Cut(h.Value, ";"); ok {
				disp += ";" + params
			}
			continue
		}
		out = append(out, h)
	}
	return append(out, &fetch.HeaderEntry{Name: "Content-Disposition", Value: disp})
}

// downloadedFile is the path of a finished download: the browser's, which
// must be in browserDownloadDir, else the suggested name there.
func downloadedFile(filePath, suggested string) (string, bool) {
	dir := path.Clean(browserDownloadDir)
	if filePath != "" {
		p := path.Clean(filePath)
		return p, strings.HasPrefix(p, dir+"/") && !strings.ContainsRune(p, 0)
	}
	name := path.Base(suggested)
	if name == "." || name == "/" || name == ".." || strings.ContainsAny(name, "/\x00") {
		return "", false
	}
	return path.Join(dir, name), true
}

// move moves the downloaded file src to dest inside the sandbox (its
// directory made), as root.
func (bc *browserCall) move(src, dest string) (*sdk.CallToolResult, error) {
	st, err := bc.t.h.cfg.Service.Exec(bc.ctx, bc.t.s.caller(), bc.id, guest.ExecSpec{
		Argv:           []string{"sh", "-c", `mkdir -p -- "$(dirname -- "$2")" && exec mv -fT -- "$1" "$2"`, "sh", src, dest},
		Timeout:        time.Minute,
		MaxOutputBytes: 4 << 10,
	}, true)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	out := newOutput(2 << 10)
	exit, err := guest.Drain(st, out.stdout, out.stderr)
	if err != nil {
		return nil, err
	}
	if exit.Code != 0 || exit.Signal != 0 {
		return errorResult(fmt.Sprintf("the file was downloaded to %s, but moving it to %s failed: %s", src, dest,
			capRunes(oneLine(out.stderr.buf.String()), maxPageString))), nil
	}
	return nil, nil
}
