package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestDashboard drives the web dashboard of a real `airlock serve` in
// headless Chromium (Debian's chromium, over CDP with chromedp): sign in
// with a key, see a sandbox made through the API, open its terminal and
// run `echo hi`, pause and resume it from the list (QEMU only: gVisor
// sandboxes cannot pause), cancel a kill, sign out. The pages must log no
// console error (CSP violations included). A screenshot of each page goes
// to $AIRLOCK_TEST_ARTEFACTS (or the test's temp dir), named in the log.
func TestDashboard(t *testing.T) {
	e := setup(t)
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("the vm tier's dashboard test needs Debian's chromium (run: make deps)")
	}
	art := os.Getenv("AIRLOCK_TEST_ARTEFACTS")
	if art == "" {
		art = t.TempDir()
	}
	art = filepath.Join(art, "dashboard-"+map[bool]string{true: "gvisor", false: "qemu"}[onGVisor()])
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", art)

	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-dashboard"))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", key[4:14]) })
	s := startServe(t, e)
	code, b := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{"timeout_s":900,"metadata":{"purpose":"dashboard-e2e"}}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(b, &sb)
	t.Cleanup(func() { s.do(key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.NoSandbox, // Chromium's own sandbox cannot run as root
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("headless", "new"),
	)
	actx, acancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer acancel()
	bctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancel()
	// The first action starts the browser and must not run under a timeout
	// (it would end the browser); the steps do.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// Every console error or warning, uncaught exception and browser log
	// error (a script or style the CSP refused, a failed load) is a failure.
	var mu sync.Mutex
	var problems []string
	watching := true
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		if !watching {
			return
		}
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				problems = append(problems, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			if d.Exception != nil {
				problems = append(problems, "exception: "+d.Text+" "+d.Exception.Description)
			} else {
				problems = append(problems, "exception: "+d.Text)
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError || ev.Entry.Level == log.EntryLevelWarning {
				problems = append(problems, fmt.Sprintf("log %s: %s (%s)", ev.Entry.Level, ev.Entry.Text, ev.Entry.URL))
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return chromedp.Void{}, err
			}
			return chromedp.Void{}, os.WriteFile(filepath.Join(art, name+".png"), png, 0o644)
		}
	}
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("browser: %s", p)
		}
		problems, watching = nil, false
	}
	// Each step has two minutes; a failed one leaves a screenshot.
	run := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
		defer cancel()
		if err := chromedp.Do(ctx, actions...); err != nil {
			ctx, cancel := context.WithTimeout(bctx, 10*time.Second)
			defer cancel()
			loc, _ := chromedp.Run(ctx, chromedp.Location())
			html, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
			_ = chromedp.Do(ctx, shot("failed-"+strings.ReplaceAll(step, " ", "-")))
			report()
			t.Fatalf("%s (page %s): %v\npage text:\n%s", step, loc, err, html)
		}
	}
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(2*time.Minute))
	}
	row := `tr[data-id="` + sb.ID + `"]`
	state := func(want string) chromedp.Action[chromedp.Void] {
		return poll(`(() => { const c = document.querySelector('` + row + ` td.state'); return c && c.textContent.startsWith('` + want + `'); })()`)
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	id := func(sel string) chromedp.ID { return chromedp.ID(sel) }

	// Signed out, / leads to the sign-in page.
	run("open the dashboard",
		chromedp.Navigate(s.base+"/"),
		chromedp.WaitVisible(id("key")),
		shot("1-sign-in"))
	loc, err := chromedp.Run(bctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(loc, "/ui/sign-in") {
		t.Fatalf("signed out, / went to %s", loc)
	}
	// A wrong key is refused on the page.
	run("sign in with a wrong key",
		chromedp.SendKeys(id("key"), key[:len(key)-2]+"zz"),
		chromedp.Click(id("sign-in")),
		chromedp.WaitVisible(id("sign-in-error")),
		poll(`document.getElementById('sign-in-error').textContent.includes('not valid')`))
	// The browser logs the refused sign-in's 401 as a failed load: expected.
	mu.Lock()
	problems = nil
	mu.Unlock()
	// The right key: the list shows the sandbox made through the API.
	run("sign in",
		chromedp.SendKeys(id("key"), key),
		chromedp.Submit(id("key")),
		chromedp.WaitVisible(css(row)),
		state("running"),
		chromedp.WaitVisible(chromedp.Search(`//td[contains(@class,"md")][contains(., "purpose=dashboard-e2e")]`)),
		shot("2-list"))

	// The filter hides rows that do not match, and shows them again.
	run("filter",
		chromedp.SendKeys(id("filter"), "no-such-sandbox"),
		chromedp.WaitNotPresent(css(row)),
		chromedp.WaitVisible(id("empty")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](`(() => { const f = document.getElementById('filter'); f.value = ''; f.dispatchEvent(new Event('input')); return true; })()`)(ctx, tg)
			return err
		}),
		chromedp.SendKeys(id("filter"), sb.ID[:6]),
		chromedp.WaitVisible(css(row)))

	// The sandbox's page and its terminal: `echo hi` prints hi.
	run("open the sandbox page",
		chromedp.Click(css(row+` a`)),
		chromedp.WaitVisible(id("open-terminal")),
		chromedp.WaitVisible(chromedp.Search(`//dd[contains(., "purpose=dashboard-e2e")]`)))
	run("open the terminal",
		chromedp.Click(id("open-terminal")),
		poll(`document.getElementById('term-status').textContent.startsWith('connected')`),
		chromedp.WaitReady(css(`.xterm-helper-textarea`)),
		// The page gives the terminal the keyboard focus.
		poll(`document.activeElement && document.activeElement.classList.contains('xterm-helper-textarea')`))
	// typeLine types text as an input method inserts it, then Enter as a
	// bare key down: chromedp's KeyEvent sends a key down with text and a
	// char event, which xterm.js takes as two keystrokes.
	typeLine := func(text string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if _, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: text}); err != nil {
				return err
			}
			for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, input.DispatchKeyEventParams{
					Type: typ, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13,
				}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	run("type echo hi",
		typeLine("echo hi"),
		poll(`Array.from(document.querySelectorAll('.xterm-rows > div')).some(d => d.textContent.trim() === 'hi')`),
		shot("3-terminal"))
	// The terminal is sized to its box (about 140 columns at 1280 pixels),
	// not left at 80x24.
	run("stty size", typeLine("stty size"),
		poll(`Array.from(document.querySelectorAll('.xterm-rows > div')).some(d => /^\d+ \d+$/.test(d.textContent.trim()))`))
	size, err := chromedp.Run(bctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll('.xterm-rows > div')).map(d => d.textContent.trim()).find(t => /^\d+ \d+$/.test(t))`))
	if err != nil {
		t.Fatal(err)
	}
	var rows, cols int
	if _, err := fmt.Sscanf(size, "%d %d", &rows, &cols); err != nil || rows < 20 || cols <= 100 {
		t.Errorf("stty size in the dashboard's terminal: %q; want the box's size (more than 100 columns)", size)
	}
	t.Logf("the terminal is %d rows by %d columns", rows, cols)
	run("close the terminal",
		chromedp.Click(id("close-terminal")),
		chromedp.WaitVisible(id("open-terminal")))
	// Closing the socket kills the shell; a pause without force waits for
	// no command to run.
	var execs []byte
	if !testutil.WaitFor(t, time.Minute, func() bool {
		_, execs = s.do(key, "GET", "/v1/sandboxes/"+sb.ID+"/execs", nil)
		return !strings.Contains(string(execs), `"state":"running"`)
	}) {
		t.Fatalf("the terminal's shell still runs a minute after the terminal closed: %s", execs)
	}

	run("back to the list",
		chromedp.Navigate(s.base+"/"),
		chromedp.WaitVisible(css(row)),
		state("running"))
	if onGVisor() {
		t.Log("pause and resume not driven: gVisor sandboxes cannot pause (the qemu runtime's snapshot does it)")
	} else {
		run("pause",
			chromedp.Click(css(row+` button[data-action="pause"]`)),
			state("paused"),
			shot("4-paused"))
		run("resume",
			chromedp.Click(css(row+` button[data-action="resume"]`)),
			state("running"))
	}
	// Kill asks first; cancel leaves the sandbox running.
	run("kill, then cancel",
		chromedp.Click(css(row+` button[data-action="kill"]`)),
		chromedp.WaitVisible(css(row+` button[data-action="confirm-kill"]`)),
		shot("5-kill-confirm"),
		chromedp.Click(css(row+` button[data-action="cancel"]`)),
		chromedp.WaitVisible(css(row+` button[data-action="kill"]`)),
		state("running"))

	// Create through the form (network deny with one allow rule), then kill
	// it from its row, confirmed.
	run("create",
		chromedp.SendKeys(id("c-allow"), "example.com"),
		chromedp.SetValue(css(`#c-mode`), "deny"),
		chromedp.Click(id("create")),
		poll(`/^created [a-z2-7]+$/.test(document.getElementById('create-status').textContent)`),
		shot("6-created"))
	created, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('create-status').textContent.slice(8)`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.do(key, "DELETE", "/v1/sandboxes/"+created, nil) })
	code, b = s.do(key, "GET", "/v1/sandboxes/"+created, nil)
	var got struct {
		State   string
		Network struct {
			Mode  string
			Allow []string
		}
	}
	_ = json.Unmarshal(b, &got)
	if code != 200 || got.State != "running" || got.Network.Mode != "deny" || len(got.Network.Allow) != 1 || got.Network.Allow[0] != "example.com" {
		t.Fatalf("the sandbox the form made: %d %s; want running, deny, allow example.com", code, b)
	}
	crow := `tr[data-id="` + created + `"]`
	run("kill",
		chromedp.WaitVisible(css(crow)),
		chromedp.Click(css(crow+` button[data-action="kill"]`)),
		chromedp.Click(css(crow+` button[data-action="confirm-kill"]`)),
		chromedp.WaitNotPresent(css(crow)),
		state("running"))
	if code, b := s.do(key, "GET", "/v1/sandboxes/"+created, nil); code != 404 {
		t.Fatalf("the killed sandbox: %d %s; want 404", code, b)
	}

	// Sign out: back to the sign-in page, and the old session is dead.
	run("sign out",
		chromedp.Click(id("sign-out")),
		chromedp.WaitVisible(id("key")),
		shot("7-signed-out"))

	// An admin key's session sees every tenant's sandboxes, grouped by
	// tenant.
	admin := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-dashboard-ops", "--admin"))
	admin = admin[strings.LastIndex(admin, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", admin[4:14]) })
	run("admin",
		chromedp.SendKeys(id("key"), admin),
		chromedp.Submit(id("key")),
		chromedp.WaitVisible(css(row)),
		chromedp.WaitVisible(chromedp.Search(`//tr[@class="group"]/th[normalize-space(.)="tenant e2e-dashboard"]`)),
		chromedp.WaitVisible(chromedp.Search(`//td[contains(@class,"tenant")][normalize-space(.)="e2e-dashboard"]`)),
		shot("8-admin"),
		chromedp.Click(id("sign-out")),
		chromedp.WaitVisible(id("key")))
	report()
	status, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch('/v1/sandboxes').then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if status != 401 {
		t.Errorf("/v1/sandboxes from the page after sign out: %d, want 401", status)
	}
	if code, _ := s.do(key, "GET", "/v1/sandboxes/"+sb.ID, nil); code != 200 {
		t.Errorf("the sandbox after the dashboard session: %d", code)
	}
}
