package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDashboardFirefox drives the web dashboard of a real `airlock serve`
// in headless Firefox ESR (Debian's firefox-esr, over WebDriver BiDi with
// puppeteer-core: test/firefox/dashboard.mjs): sign in with a key, see a
// sandbox made through the API in the list, open its page and its terminal
// and run `echo hi`, open the Server page, sign out. The pages must log no
// console error or warning, page error or CSP violation (the script proves
// its watcher first). TestDashboard drives the same pages, and more, in
// Chromium. A screenshot of each page goes to $AIRLOCK_TEST_ARTEFACTS (or
// the test's temp dir), named in the log.
func TestDashboardFirefox(t *testing.T) {
	e := setup(t)
	firefox, err := exec.LookPath("firefox-esr")
	if err != nil {
		t.Fatal("the vm tier's Firefox dashboard test needs Debian's firefox-esr (run: make deps)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("the vm tier's Firefox dashboard test needs node and npm (run: make deps)")
	}
	dir, err := filepath.Abs("../firefox")
	if err != nil {
		t.Fatal(err)
	}
	art := os.Getenv("AIRLOCK_TEST_ARTEFACTS")
	if art == "" {
		art = t.TempDir()
	}
	art = filepath.Join(art, "dashboard-firefox-"+map[bool]string{true: "gvisor", false: "qemu"}[onGVisor()])
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", art)

	// puppeteer-core at the version package-lock.json pins (npm ci, from
	// npm's cache after the first run; it downloads no browser), unless
	// node_modules already holds exactly what the lock file names.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if !npmInstalled(t, dir) {
		npm := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir = dir
		if b, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/firefox: %v\n%s", err, b)
		}
		if !npmInstalled(t, dir) {
			t.Fatal("npm ci in test/firefox left node_modules unlike package-lock.json")
		}
	}

	const tenant = "e2e-dashboard-firefox"
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", tenant))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", key[4:14]) })
	s := startServe(t, e)
	code, b := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{"timeout_s":900,"metadata":{"purpose":"dashboard-firefox"}}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(b, &sb)
	t.Cleanup(func() { s.do(key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })

	start := time.Now()
	c := exec.CommandContext(ctx, node, "dashboard.mjs")
	c.Dir = dir
	c.Env = append(os.Environ(),
		"AIRLOCK_URL="+s.base, "AIRLOCK_KEY="+key, "SANDBOX_ID="+sb.ID, "TENANT="+tenant,
		"ARTEFACTS="+art, "FIREFOX="+firefox)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("node dashboard.mjs: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	var res struct {
		Browser string
		Steps   []struct {
			Name string
			MS   int
		}
		Problems []string
		Failed   *struct{ Step, Error, URL, Text string }
		Terminal *struct{ Rows, Cols int }
		Width    map[string][2]int
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("the script's result: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	t.Logf("%s drove the dashboard in %s", res.Browser, time.Since(start).Round(time.Millisecond))
	for _, st := range res.Steps {
		t.Logf("step %q: %d ms", st.Name, st.MS)
	}
	for _, p := range res.Problems {
		t.Errorf("firefox: %s", p)
	}
	if res.Failed != nil {
		t.Fatalf("step %q failed (page %s): %s\npage text:\n%s\nstderr: %s", res.Failed.Step, res.Failed.URL, res.Failed.Error, res.Failed.Text, stderr.String())
	}
	if !strings.HasPrefix(res.Browser, "firefox/") {
		t.Errorf("the browser the script drove: %q, want firefox/...", res.Browser)
	}
	want := []string{"prove the watcher", "sign in", "open the sandbox page", "open the terminal", "type echo hi", "stty size", "the audit shows the programs", "close the terminal", "the server page", "sign out"}
	var got []string
	for _, st := range res.Steps {
		got = append(got, st.Name)
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("steps done: %q, want %q", got, want)
	}
	// The terminal is sized to its box (about 140 columns at 1280 pixels),
	// not left at 80x24.
	if res.Terminal == nil || res.Terminal.Rows < 20 || res.Terminal.Cols <= 100 {
		t.Errorf("stty size in Firefox's terminal: %+v; want the box's size (more than 100 columns)", res.Terminal)
	} else {
		t.Logf("the terminal is %d rows by %d columns", res.Terminal.Rows, res.Terminal.Cols)
	}
	// Usable at 1280x800: nothing wider than the window.
	for pg, w := range res.Width {
		if w[0] > w[1] {
			t.Errorf("the %s page is %d pixels wide in a %d-pixel window", pg, w[0], w[1])
		}
	}
	for _, name := range []string{"1-sign-in", "2-list", "3-terminal", "4-server", "5-signed-out"} {
		if fi, err := os.Stat(filepath.Join(art, name+".png")); err != nil || fi.Size() == 0 {
			t.Errorf("screenshot %s: %v", name, err)
		}
	}
	if code, _ := s.do(key, "GET", "/v1/sandboxes/"+sb.ID, nil); code != 200 {
		t.Errorf("the sandbox after the dashboard session: %d", code)
	}
}

// npmInstalled reports whether dir's node_modules holds the packages its
// package-lock.json names: npm ci writes the same entries to
// node_modules/.package-lock.json.
func npmInstalled(t *testing.T, dir string) bool {
	t.Helper()
	read := func(name string) map[string]any {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil
		}
		var lock struct{ Packages map[string]any }
		if err := json.Unmarshal(b, &lock); err != nil {
			return nil
		}
		delete(lock.Packages, "") // the project itself, only in the lock file
		return lock.Packages
	}
	want := read("package-lock.json")
	if len(want) == 0 {
		t.Fatalf("%s/package-lock.json names no packages", dir)
	}
	return reflect.DeepEqual(want, read("node_modules/.package-lock.json"))
}
