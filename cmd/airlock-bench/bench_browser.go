package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// The browser rows' samples. A Chromium start under QEMU's TCG takes
// minutes, so TCG gets one sample.
const (
	browserHostStarts = 3 // host Chromium starts
	browserStarts     = 3 // browser sandboxes started per runtime (gvisor; qemu under KVM)
	browserStartsTCG  = 1 // the same, qemu under TCG
	browserLoads      = 5 // page loads after a warm-up, host and sandboxes
)

// browserPage is the page the load rows fetch, on the host and in the
// guests.
const browserPage = "<!doctype html><title>airlock bench</title><p>airlock bench</p>"

// browserHostChromium is Debian's Chromium (scripts/deps.sh installs it;
// the browser image has the same package).
const browserHostChromium = "/usr/bin/chromium"

// browserBench measures a browser sandbox per runtime present: Chromium's
// start until its DevTools endpoint answers (`airlock browser start`), a
// page load through `airlock browser cdp`, and the host memory of the
// sandbox once its browser is up with a page loaded. The start and the
// load are each divided by the same on the host's Chromium, measured in
// the same run. accel is the qemu runtime's acceleration (the probe's).
// Every sandbox and process it starts is gone on return, error or not.
func browserBench(ctx context.Context, c airlockCLI, l statedir.Layout, accel string) (rows [][3]string, err error) {
	out, err := c.run("image", "ls", "--json")
	if err != nil {
		return nil, fmt.Errorf("image ls: %w", err)
	}
	var images []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(out), &images); err != nil {
		return nil, fmt.Errorf("image ls printed %q: %w", out, err)
	}
	haveImage := false
	for _, im := range images {
		haveImage = haveImage || im.Name == "browser"
	}
	if !haveImage {
		return [][3]string{{"browser sandbox rows", "-", "skipped: no image \"browser\" in the state dir (airlock setup --browser builds it)"}}, nil
	}

	fmt.Fprintln(os.Stderr, "bench: host Chromium")
	host, err := hostBrowserBaseline(ctx)
	if err != nil {
		return nil, fmt.Errorf("host chromium: %w", err)
	}
	sandboxFlag := ""
	if host.noSandbox {
		sandboxFlag = ", --no-sandbox (root)"
	}
	rows = append(rows, [3]string{"host Chromium, the baseline: start to first CDP answer / page load", ms(host.start) + " / " + ms(host.load.median),
		fmt.Sprintf("%s; %s --headless=new, a fresh --user-data-dir%s, from exec until /json/version answers, median of %d; chromedp Navigate to a small page of a Go server on 127.0.0.1 until the load event, median of %d after one warm-up (%s); in the page (Navigation Timing, start to load): %s",
			host.product, browserHostChromium, sandboxFlag, browserHostStarts, browserLoads, ms(host.load.first), ms(host.load.inPage))})

	runtimes := []string{"qemu"}
	if _, err := gvisor.FindRunsc(); err == nil {
		runtimes = append(runtimes, "gvisor")
	}
	for _, rt := range runtimes {
		n := browserStarts
		if rt == "qemu" && accel == "tcg" {
			n = browserStartsTCG
		}
		rr, err := browserRuntime(ctx, c, l, rt, n, host)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			// A row, so that the other runtime's rows are still measured
			// and printed.
			fmt.Fprintf(os.Stderr, "bench: %s browser rows: %v\n", rt, err)
			rr = [][3]string{{"browser sandbox rows, " + rt, "failed", strings.NewReplacer("\n", " ", "|", "/").Replace(err.Error())}}
		}
		rows = append(rows, rr...)
	}
	return rows, nil
}

// browserStatus is `airlock browser start --json`'s answer (the parts the
// rows read).
type browserStatus struct {
	Running bool   `json:"running"`
	Browser string `json:"browser"`
	Sandbox bool   `json:"sandbox"`
}

// browserRuntime measures runtime rt: n browser sandboxes, each created
// and then timed through `airlock browser start`; the last one also serves
// a page that its Chromium loads over CDP, and is measured idle.
func browserRuntime(ctx context.Context, c airlockCLI, l statedir.Layout, rt string, n int, host hostBrowser) (rows [][3]string, err error) {
	cc := c
	cc.ctx = context.WithoutCancel(c.ctx) // cleanup runs after an interrupt too
	var (
		starts            []time.Duration
		st                browserStatus
		id                string // the sandbox running now
		before, beforeRSS int64
	)
	remove := func() error {
		old := id
		id = ""
		if _, err := cc.run("rm", old); err != nil {
			return fmt.Errorf("rm %s: %w", old, err)
		}
		return nil
	}
	defer func() {
		if id != "" {
			err = errors.Join(err, remove())
		}
	}()
	for i := range n {
		fmt.Fprintf(os.Stderr, "bench: %s browser sandbox %d/%d\n", rt, i+1, n)
		if id != "" { // the previous sample's
			if err := remove(); err != nil {
				return nil, err
			}
		}
		created, err := c.run("--runtime", rt, "create", "--image", "browser")
		if err != nil {
			return nil, fmt.Errorf("create --image browser: %w", err)
		}
		id = created
		if i == n-1 { // the memory row's reference: the sandbox before Chromium
			time.Sleep(2 * time.Second)
			beforeRSS, before = sandboxMemory(l.ShimLock(id))
		}
		t := time.Now()
		out, err := c.run("browser", "start", id, "--json")
		d := time.Since(t)
		if err != nil {
			// What the launcher's processes said, for the error.
			logs, _ := c.run("exec", id, "--", "sh", "-c", "tail -n 3 /run/airlock-browser/*.log 2>&1 | tail -c 1500")
			return nil, fmt.Errorf("browser start after %s: %w; the launcher's logs: %s", ms(d), err, logs)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil || !st.Running {
			return nil, fmt.Errorf("browser start printed %q (%v)", out, err)
		}
		starts = append(starts, d)
	}

	fmt.Fprintf(os.Stderr, "bench: %s page loads\n", rt)
	serve := "mkdir -p /srv && printf '%s\\n' '" + browserPage + "' > /srv/index.html && " +
		"(nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv >/dev/null 2>&1 &) && " +
		"for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; echo 'the page server never answered' >&2; exit 1"
	if _, err := c.run("exec", id, "--", "bash", "-c", serve); err != nil {
		return nil, fmt.Errorf("page server: %w", err)
	}
	ws, stop, err := browserCDP(c, id)
	if err != nil {
		return nil, err
	}
	defer stop()
	pl, err := openPage(ctx, ws)
	if err != nil {
		return nil, err
	}
	defer pl.close()
	lt, err := pl.loads(ctx, "http://localhost:8000/", browserLoads)
	if err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second) // let the idle guest settle
	rss, pss := sandboxMemory(l.ShimLock(id))

	start := median(starts)
	own := "on"
	if !st.Sandbox {
		own = "off (the guest kernel does not allow it)"
	}
	samples := fmt.Sprintf("median of %d fresh browser sandboxes", n)
	if n == 1 {
		samples = "1 fresh browser sandbox"
	}
	procs := "shim + VMM"
	if rt == "gvisor" {
		procs = "shim + runsc, gofer, sentry"
	}
	return [][3]string{
		{"Chromium start to first CDP answer (`airlock browser start --json`), " + rt + ", vs host", fmt.Sprintf("%s, %.1fx", ms(start), float64(start)/float64(host.start)),
			fmt.Sprintf("%s; the CLI process and an exec of the launcher, which starts Xvfb, Chromium (windowed on Xvfb; its own sandbox %s) and the CDP relay, until Chromium answers; %s", samples, own, st.Browser)},
		{"page load (chromedp Navigate until load, through `airlock browser cdp`), " + rt + ", vs host", fmt.Sprintf("%s, %.1fx", ms(lt.median), float64(lt.median)/float64(host.load.median)),
			fmt.Sprintf("median of %d after one warm-up (%s); in the page (Navigation Timing, start to load): %s (host: %s); python3 http.server in the guest; CDP through the CLI's loopback endpoint into the sandbox",
				browserLoads, ms(lt.first), ms(lt.inPage), ms(host.load.inPage))},
		{"host memory of an idle browser sandbox (" + procs + "), " + rt, fmt.Sprintf("RSS %d MiB, PSS %d MiB", rss>>10, pss>>10),
			fmt.Sprintf("Chromium started, a tab with the loaded page, 2 s settle; the same sandbox before `browser start`: RSS %d MiB, PSS %d MiB", beforeRSS>>10, before>>10)},
	}, nil
}

// browserCDP runs `airlock browser cdp id` and returns the WebSocket
// endpoint it printed; stop interrupts it and waits for it.
func browserCDP(c airlockCLI, id string) (ws string, stop func(), err error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.ctx))
	cmd := exec.CommandContext(ctx, c.cfg.airlock, append(slices.Clone(c.base), "browser", "cdp", id)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return "", nil, fmt.Errorf("browser cdp: %w", err)
	}
	stop = func() { cancel(); _ = cmd.Wait() }
	br := bufio.NewReader(out)
	line, err := br.ReadString('\n')
	ws = strings.TrimSpace(line)
	if err != nil || !strings.HasPrefix(ws, "ws://127.0.0.1:") {
		stop()
		return "", nil, fmt.Errorf("browser cdp printed %q (%v)", line, err)
	}
	// The http:// line stays in the pipe, unread, until Wait closes it.
	return ws, stop, nil
}

// page is a tab of a running browser, driven over CDP by chromedp.
type page struct {
	ctx   context.Context
	close func()
}

// openPage attaches chromedp to the browser at the DevTools WebSocket ws
// and opens a tab. close closes the tab and the connection.
func openPage(ctx context.Context, ws string) (*page, error) {
	actx, acancel := remote.NewAllocator(ctx, ws, remote.NoModifyURL)
	tctx, tcancel := chromedp.NewContext(actx)
	p := &page{ctx: tctx, close: func() { tcancel(); acancel() }}
	// The first run opens the tab, and the connection lives as long as its
	// context: no timeout here (chromedp's rule), the dial has its own.
	if err := chromedp.Do(tctx); err != nil {
		p.close()
		return nil, fmt.Errorf("open a tab: %w", err)
	}
	return p, nil
}

// loadTimes are a tab's page loads.
type loadTimes struct {
	first  time.Duration // the warm-up
	median time.Duration // of the loads after it, over CDP: Page.navigate until the load event
	inPage time.Duration // their median as the page saw it (Navigation Timing: start to load)
}

// inPageJS is the last navigation's time from its start to the end of its
// load event, in ms, as the page measured it.
const inPageJS = `(e => e.loadEventEnd || e.loadEventStart)(performance.getEntriesByType("navigation")[0])`

// loads navigates to base once (the warm-up) and then n times, each with
// its own query string so that nothing comes from the cache, and times
// each until the load event.
func (p *page) loads(ctx context.Context, base string, n int) (loadTimes, error) {
	var lt loadTimes
	load := func(u string) (d, inPage time.Duration, err error) {
		lctx, cancel := context.WithTimeout(p.ctx, 2*time.Minute)
		defer cancel()
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
		t := time.Now()
		if err := chromedp.Do(lctx, chromedp.Navigate(u)); err != nil {
			return 0, 0, fmt.Errorf("navigate %s: %w", u, err)
		}
		d = time.Since(t)
		msec, err := chromedp.Run(lctx, chromedp.Evaluate[float64](inPageJS))
		if err != nil {
			return 0, 0, fmt.Errorf("navigation timing of %s: %w", u, err)
		}
		return d, time.Duration(msec * float64(time.Millisecond)), nil
	}
	var err error
	if lt.first, _, err = load(base + "?warm-up"); err != nil {
		return lt, err
	}
	var ds, inPage []time.Duration
	for i := range n {
		d, ip, err := load(base + "?" + strconv.Itoa(i))
		if err != nil {
			return lt, err
		}
		ds, inPage = append(ds, d), append(inPage, ip)
	}
	lt.median, lt.inPage = median(ds), median(inPage)
	return lt, nil
}

// hostBrowser is the host's Chromium, the baseline.
type hostBrowser struct {
	start     time.Duration // median
	load      loadTimes
	product   string // "Chrome/156..."
	noSandbox bool   // started with --no-sandbox (as root)
}

// hostBrowserBaseline starts the host's Chromium browserHostStarts times,
// and loads a page of a loopback server in the last one.
func hostBrowserBaseline(ctx context.Context) (hostBrowser, error) {
	var h hostBrowser
	h.noSandbox = os.Geteuid() == 0 // Chromium refuses root without it
	var starts []time.Duration
	var last *hostChromium
	defer func() {
		if last != nil {
			last.stop()
		}
	}()
	for range browserHostStarts {
		if last != nil {
			last.stop()
			last = nil
		}
		hc, d, err := startHostChromium(ctx, h.noSandbox)
		if err != nil {
			return h, err
		}
		last = hc
		starts = append(starts, d)
	}
	h.start = median(starts)
	h.product = last.product

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return h, err
	}
	srv := &http.Server{ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, browserPage+"\n")
	})}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() { srv.Close(); <-served }()

	p, err := openPage(ctx, last.ws)
	if err != nil {
		return h, err
	}
	defer p.close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if h.load, err = p.loads(ctx, "http://localhost:"+port+"/", browserLoads); err != nil {
		return h, err
	}
	return h, nil
}

// hostChromium is a running host Chromium.
type hostChromium struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	dir     string        // its --user-data-dir and stderr, removed by stop
	ws      string        // its browser WebSocket
	product string
}

// stop kills Chromium's process group, waits for Chromium and removes its
// profile.
func (hc *hostChromium) stop() {
	_ = syscall.Kill(-hc.cmd.Process.Pid, syscall.SIGKILL)
	<-hc.exited
	_ = os.RemoveAll(hc.dir)
}

// startHostChromium starts the host's Chromium with a fresh profile and
// returns it once its DevTools endpoint answers /json/version, with the
// time from exec to that answer.
func startHostChromium(ctx context.Context, noSandbox bool) (*hostChromium, time.Duration, error) {
	dir, err := os.MkdirTemp("", "airlock-bench-chromium-")
	if err != nil {
		return nil, 0, err
	}
	profile := filepath.Join(dir, "profile")
	errLog, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		return nil, 0, errors.Join(err, os.RemoveAll(dir))
	}
	defer errLog.Close()
	args := []string{"--headless=new", "--remote-debugging-port=0", "--no-first-run", "--user-data-dir=" + profile}
	if noSandbox {
		args = append(args, "--no-sandbox")
	}
	cmd := exec.Command(browserHostChromium, append(args, "about:blank")...)
	cmd.Stdout, cmd.Stderr = errLog, errLog
	// Its own process group, so that stop ends the zygote, GPU and
	// renderer processes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	t := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, 0, errors.Join(err, os.RemoveAll(dir))
	}
	hc := &hostChromium{cmd: cmd, exited: make(chan struct{}), dir: dir}
	go func() { _ = cmd.Wait(); close(hc.exited) }()
	fail := func(err error) (*hostChromium, time.Duration, error) {
		b, _ := os.ReadFile(filepath.Join(dir, "stderr"))
		hc.stop()
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		return nil, 0, fmt.Errorf("%w; its stderr: %s", err, strings.TrimSpace(string(b)))
	}
	cl := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		if ver, ok := hostDevTools(ctx, cl, profile); ok {
			d := time.Since(t)
			hc.ws, hc.product = ver.WebSocketDebuggerURL, ver.Browser
			return hc, d, nil
		}
		select {
		case <-hc.exited:
			return fail(errors.New("chromium exited before its DevTools endpoint answered"))
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fail(errors.New("chromium's DevTools endpoint did not answer in a minute"))
		}
	}
}

// devToolsVersion is what /json/version answers (the parts read).
type devToolsVersion struct {
	Browser              string `json:"Browser"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
}

// hostDevTools asks the DevTools endpoint that Chromium wrote to
// profile/DevToolsActivePort (its port on the first line) for
// /json/version; ok is false until it answers.
func hostDevTools(ctx context.Context, cl *http.Client, profile string) (devToolsVersion, bool) {
	var v devToolsVersion
	b, err := os.ReadFile(filepath.Join(profile, "DevToolsActivePort"))
	if err != nil {
		return v, false
	}
	port, _, _ := strings.Cut(string(b), "\n")
	if _, err := strconv.Atoi(strings.TrimSpace(port)); err != nil {
		return v, false // not written in full yet
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strings.TrimSpace(port)+"/json/version", nil)
	if err != nil {
		return v, false
	}
	resp, err := cl.Do(req)
	if err != nil {
		return v, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&v) != nil || v.WebSocketDebuggerURL == "" {
		return v, false
	}
	return v, true
}
