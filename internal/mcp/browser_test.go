package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	jsonv2 "github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestParseRef(t *testing.T) {
	for in, want := range map[string]string{"e12": "e12", "[e7]": "e7", " e1 ": "e1", "e1000000": "e1000000"} {
		if got, err := parseRef(in); err != nil || got != want {
			t.Errorf("parseRef(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "e", "e0", "e01", "e-1", "12", "x12", "e1x", "E12", "e99999999999", "[e12", "e1 e2"} {
		if got, err := parseRef(in); err == nil || !strings.Contains(err.Error(), "like e12") {
			t.Errorf("parseRef(%q) = %q, %v; want an error", in, got, err)
		}
	}
}

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		in   string
		key  string
		mods []chromedp.Modifier
	}{
		{"Enter", kb.Enter, nil},
		{"enter", kb.Enter, nil},
		{"Tab", kb.Tab, nil},
		{"ArrowDown", kb.ArrowDown, nil},
		{"PageDown", kb.PageDown, nil},
		{"Escape", kb.Escape, nil},
		{"Esc", kb.Escape, nil},
		{"Backspace", kb.Backspace, nil},
		{"F5", kb.F5, nil},
		{"a", "a", nil},
		{"A", "A", nil},
		{"Space", " ", nil},
		{"+", "+", nil},
		{"Control+A", "a", []chromedp.Modifier{chromedp.ModifierCtrl}},
		{"ctrl+a", "a", []chromedp.Modifier{chromedp.ModifierCtrl}},
		{"Control+Shift+a", "A", []chromedp.Modifier{chromedp.ModifierCtrl}},
		{"Shift+Tab", kb.Tab, []chromedp.Modifier{chromedp.ModifierShift}},
		{"Alt+ArrowLeft", kb.ArrowLeft, []chromedp.Modifier{chromedp.ModifierAlt}},
		{"Meta+Control++", "+", []chromedp.Modifier{chromedp.ModifierMeta, chromedp.ModifierCtrl}},
	} {
		r, mods, err := parseKey(c.in)
		if err != nil || string(r) != c.key || !slices.Equal(mods, c.mods) {
			t.Errorf("parseKey(%q) = %q %v, %v; want %q %v", c.in, r, mods, err, c.key, c.mods)
		}
	}
	for _, in := range []string{"", "Control+", "Hyper+a", "NoSuchKey", "\x01", strings.Repeat("a", 65)} {
		if _, _, err := parseKey(in); err == nil || !strings.Contains(err.Error(), "e.g. Enter") {
			t.Errorf("parseKey(%q) = %v; want an error with examples", in, err)
		}
	}
}

// axTree is an Accessibility.getFullAXTree answer as Chromium sends it,
// with a loop (41 claims the root as its child) and a node whose parent
// is missing (77) that must not hang or duplicate anything.
const axTree = `{"nodes":[
 {"nodeId":"1","ignored":false,"role":{"type":"internalRole","value":"RootWebArea"},"name":{"type":"computedString","value":"Form test"},"childIds":["2"],"backendDOMNodeId":100},
 {"nodeId":"2","ignored":true,"role":{"type":"role","value":"none"},"parentId":"1","childIds":["3","4","5","9","10"],"backendDOMNodeId":101},
 {"nodeId":"3","ignored":false,"role":{"type":"role","value":"heading"},"name":{"type":"computedString","value":"Form test"},"properties":[{"name":"level","value":{"type":"integer","value":1}}],"parentId":"2","childIds":["31"],"backendDOMNodeId":103},
 {"nodeId":"31","ignored":false,"role":{"type":"internalRole","value":"StaticText"},"name":{"type":"computedString","value":"Form test"},"parentId":"3","childIds":["32"],"backendDOMNodeId":131},
 {"nodeId":"32","ignored":false,"role":{"type":"internalRole","value":"InlineTextBox"},"name":{"type":"computedString","value":"Form test"},"parentId":"31","backendDOMNodeId":131},
 {"nodeId":"4","ignored":false,"role":{"type":"role","value":"generic"},"parentId":"2","childIds":["41"],"backendDOMNodeId":104},
 {"nodeId":"41","ignored":false,"role":{"type":"role","value":"textbox"},"name":{"type":"computedString","value":"Name"},"value":{"type":"string","value":"Ada"},"properties":[{"name":"focusable","value":{"type":"booleanOrUndefined","value":true}},{"name":"focused","value":{"type":"booleanOrUndefined","value":true}},{"name":"required","value":{"type":"boolean","value":true}}],"parentId":"4","childIds":["1"],"backendDOMNodeId":141},
 {"nodeId":"5","ignored":false,"role":{"type":"role","value":"button"},"name":{"type":"computedString","value":"Greet"},"properties":[{"name":"disabled","value":{"type":"boolean","value":true}},{"name":"expanded","value":{"type":"booleanOrUndefined","value":false}}],"parentId":"2","childIds":["51"],"backendDOMNodeId":105},
 {"nodeId":"51","ignored":false,"role":{"type":"internalRole","value":"StaticText"},"name":{"type":"computedString","value":"Greet"},"parentId":"5","backendDOMNodeId":151},
 {"nodeId":"9","ignored":false,"role":{"type":"role","value":"link"},"name":{"type":"computedString","value":"Next\n  page"},"properties":[{"name":"url","value":{"type":"string","value":"http://x/next.html"}}],"parentId":"2","childIds":["91"],"backendDOMNodeId":109},
 {"nodeId":"91","ignored":false,"role":{"type":"internalRole","value":"StaticText"},"name":{"type":"computedString","value":"Other \"words\""},"parentId":"9","backendDOMNodeId":191},
 {"nodeId":"10","ignored":false,"role":{"type":"role","value":"checkbox"},"name":{"type":"computedString","value":"Agree"},"properties":[{"name":"checked","value":{"type":"tristate","value":"mixed"}}],"parentId":"2","backendDOMNodeId":110},
 {"nodeId":"77","ignored":false,"role":{"type":"role","value":"paragraph"},"parentId":"666"}
]}`

const axTreeText = `[e1] RootWebArea "Form test"
  [e2] heading "Form test" [level=1]
  [e3] textbox "Name" value="Ada" [focused] [required]
  [e4] button "Greet" [disabled] [collapsed]
  [e5] link "Next page" url="http://x/next.html"
    text "Other \"words\""
  [e6] checkbox "Agree" [checked=mixed]
paragraph
`

func decodeAXTree(t *testing.T) []*accessibility.Node {
	t.Helper()
	var res accessibility.GetFullAXTreeResult
	if err := jsonv2.Unmarshal([]byte(axTree), &res); err != nil {
		t.Fatal(err)
	}
	return res.Nodes
}

// refNamer names nodes e1, e2, ... in the order asked, like refFor.
func refNamer() (func(cdp.BackendNodeID) string, map[string]cdp.BackendNodeID) {
	st := &browserState{refs: map[target.ID]*tabRefs{}}
	r := st.tabRefs("tab")
	shown := map[string]cdp.BackendNodeID{}
	return func(n cdp.BackendNodeID) string {
		ref := st.refFor(r, n)
		shown[ref] = n
		return ref
	}, shown
}

func TestRenderAX(t *testing.T) {
	nodes := decodeAXTree(t)
	ref, shown := refNamer()
	got, omitted := renderAX(nodes, 0, 64<<10, ref)
	if got != axTreeText || omitted != 0 {
		t.Errorf("snapshot:\n%s(omitted %d)\nwant:\n%s", got, omitted, axTreeText)
	}
	want := map[string]cdp.BackendNodeID{"e1": 100, "e2": 103, "e3": 141, "e4": 105, "e5": 109, "e6": 110}
	if !equalMaps(shown, want) {
		t.Errorf("refs = %v, want %v", shown, want)
	}

	// The part under one element.
	ref, _ = refNamer()
	got, _ = renderAX(nodes, 109, 64<<10, ref)
	if want := "[e1] link \"Next page\" url=\"http://x/next.html\"\n  text \"Other \\\"words\\\"\"\n"; got != want {
		t.Errorf("part:\n%s\nwant:\n%s", got, want)
	}

	// Cut: whole lines, a prefix of the tree, refs only for lines shown.
	ref, shown = refNamer()
	got, omitted = renderAX(nodes, 0, 90, ref)
	if !strings.HasPrefix(axTreeText, got) || !strings.HasSuffix(got, "\n") || omitted == 0 {
		t.Errorf("cut snapshot %q (omitted %d): not a prefix of whole lines", got, omitted)
	}
	if len(got)+omitted == 0 || len(shown) != strings.Count(got, "[e") || strings.Count(got, "\n")+omitted != strings.Count(axTreeText, "\n") {
		t.Errorf("cut snapshot %q: %d lines, %d omitted, refs %v", got, strings.Count(got, "\n"), omitted, shown)
	}

	// A long name is capped; names on one line.
	long := &accessibility.Node{NodeID: "1", Role: &accessibility.Value{Value: []byte(`"button"`)}, Name: &accessibility.Value{Value: []byte(`"` + strings.Repeat("x", 1000) + `\nx"`)}, BackendDOMNodeID: 1}
	ref, _ = refNamer()
	got, _ = renderAX([]*accessibility.Node{long}, 0, 64<<10, ref)
	if len(got) > 300 || strings.Count(got, "\n") != 1 || !strings.Contains(got, "…") {
		t.Errorf("long name: %q", got)
	}
}

func equalMaps[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestRefsStable(t *testing.T) {
	st := &browserState{refs: map[target.ID]*tabRefs{}}
	a, b := st.tabRefs("a"), st.tabRefs("b")
	if r1, r2 := st.refFor(a, 5), st.refFor(a, 5); r1 != r2 {
		t.Errorf("one node got refs %s and %s", r1, r2)
	}
	if ra, rb := st.refFor(a, 6), st.refFor(b, 6); ra == rb {
		t.Errorf("node 6 of two tabs got the same ref %s", ra)
	}
}

func TestCheckURL(t *testing.T) {
	for _, u := range []string{"https://example.com/", "http://localhost:8000/form.html", "about:blank", "data:text/html,hi", "file:///tmp/x.html"} {
		if _, err := checkURL(u, navigateSchemes...); err != nil {
			t.Errorf("checkURL(%q): %v", u, err)
		}
	}
	for _, u := range []string{"", "   ", "javascript:alert(1)", "chrome://settings", "example.com", "localhost:8000/x", "http://x/" + strings.Repeat("a", maxURLBytes)} {
		if _, err := checkURL(u, navigateSchemes...); err == nil {
			t.Errorf("checkURL(%q) passed", u)
		}
	}
	if _, err := checkURL("file:///etc/passwd", "http", "https"); err == nil {
		t.Error("a download of a file: URL passed")
	}
}

func TestAttachment(t *testing.T) {
	got := attachment([]*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/pdf"}, {Name: "content-disposition", Value: `inline; filename="a b.pdf"`}, nil})
	want := []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/pdf"}, {Name: "Content-Disposition", Value: `attachment; filename="a b.pdf"`}}
	if fmt.Sprint(deref(got)) != fmt.Sprint(deref(want)) {
		t.Errorf("attachment = %v, want %v", deref(got), deref(want))
	}
	if got := attachment(nil); len(got) != 1 || got[0].Value != "attachment" {
		t.Errorf("attachment(nil) = %v", deref(got))
	}
}

func deref(hs []*fetch.HeaderEntry) []fetch.HeaderEntry {
	var out []fetch.HeaderEntry
	for _, h := range hs {
		out = append(out, *h)
	}
	return out
}

func TestDownloadedFile(t *testing.T) {
	dir := browserDownloadDir
	for _, c := range []struct {
		path, name, want string
		ok               bool
	}{
		{dir + "/a.txt", "", dir + "/a.txt", true},
		{dir + "/../../etc/passwd", "", "/etc/passwd", false},
		{"/etc/passwd", "", "/etc/passwd", false},
		{"", "report.pdf", dir + "/report.pdf", true},
		{"", "../x", dir + "/x", true},
		{"", "..", "", false},
		{"", "", "", false},
	} {
		got, ok := downloadedFile(c.path, c.name)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("downloadedFile(%q, %q) = %q, %v; want %q, %v", c.path, c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestPNGSize(t *testing.T) {
	hdr := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x05\x00\x00\x00\x03\x20")
	if w, h, ok := pngSize(hdr); !ok || w != 1280 || h != 800 {
		t.Errorf("pngSize = %d, %d, %v", w, h, ok)
	}
	if _, _, ok := pngSize([]byte("GIF89a")); ok {
		t.Error("a GIF passed as a PNG")
	}
}

var browserTools = []string{"browser_click", "browser_download", "browser_eval", "browser_navigate", "browser_press", "browser_screenshot",
	"browser_scroll", "browser_snapshot", "browser_tab_close", "browser_tab_new", "browser_tab_switch", "browser_tabs", "browser_text", "browser_type"}

func TestBrowserToolsListed(t *testing.T) {
	h := newHandler(t, newFake(), nil)
	cs, end := connect(t, h)
	defer end()
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tl := range res.Tools {
		if strings.HasPrefix(tl.Name, "browser_") {
			got = append(got, tl.Name)
			if !strings.Contains(tl.Description, "browser sandbox") {
				t.Errorf("%s: the description does not say which sandbox it uses", tl.Name)
			}
			b, _ := json.Marshal(tl.InputSchema)
			if !strings.Contains(string(b), `"sandbox_id"`) {
				t.Errorf("%s: no sandbox_id in %s", tl.Name, b)
			}
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, browserTools) {
		t.Errorf("browser tools = %v, want %v", got, browserTools)
	}
	if init := cs.InitializeResult(); init == nil || !strings.Contains(init.Instructions, "browser_snapshot") {
		t.Error("the instructions do not mention the browser tools")
	}
}

// TestBrowserInput checks what is refused before any browser is reached
// (no sandbox is made for it), and a sandbox without a browser.
func TestBrowserInput(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"browser_navigate", map[string]any{}, "url"},
		{"browser_navigate", map[string]any{"url": " "}, "url must be"},
		{"browser_navigate", map[string]any{"url": "javascript:alert(1)"}, "schemes http, https"},
		{"browser_navigate", map[string]any{"url": "example.com"}, "schemes"},
		{"browser_click", map[string]any{}, "give ref"},
		{"browser_click", map[string]any{"ref": "e1", "selector": "#a"}, "not both"},
		{"browser_click", map[string]any{"ref": "button"}, "like e12"},
		{"browser_click", map[string]any{"selector": strings.Repeat("a", maxSelectorBytes+1)}, "selector must be"},
		{"browser_type", map[string]any{"text": "x"}, "give ref"},
		{"browser_type", map[string]any{"ref": "e1", "text": strings.Repeat("x", maxTypeBytes+1)}, "text must be"},
		{"browser_press", map[string]any{"key": "Hyper+a"}, "unknown modifier"},
		{"browser_press", map[string]any{"key": "Enter", "ref": "e1", "selector": "a"}, "not both"},
		{"browser_scroll", map[string]any{}, "give dy"},
		{"browser_scroll", map[string]any{"dy": 2_000_000}, "between"},
		{"browser_snapshot", map[string]any{"ref": "12"}, "like e12"},
		{"browser_eval", map[string]any{"expression": "  "}, "expression must be"},
		{"browser_download", map[string]any{"url": "file:///etc/passwd"}, "schemes http, https"},
		{"browser_download", map[string]any{"url": "https://example.com/x", "path": "x.txt"}, "absolute path"},
		{"browser_tab_new", map[string]any{"url": "chrome://settings"}, "schemes"},
		{"browser_navigate", map[string]any{"url": "https://example.com", "timeout_s": -1}, "timeout_s"},
	} {
		txt, res := call(t, cs, c.tool, c.args)
		if !res.IsError || !strings.Contains(txt, c.want) {
			t.Errorf("%s %v = %q; want an error with %q", c.tool, c.args, txt, c.want)
		}
	}
	if ids := f.ids(); len(ids) != 0 {
		t.Errorf("refused calls made sandboxes %v", ids)
	}

	// A sandbox of another image has no browser: the manager's words.
	txt, res := call(t, cs, "sandbox_create", nil)
	var sb sandboxView
	if res.IsError || json.Unmarshal([]byte(txt), &sb) != nil {
		t.Fatalf("create: %s", txt)
	}
	txt, res = call(t, cs, "browser_navigate", map[string]any{"sandbox_id": sb.ID, "url": "https://example.com/"})
	if !res.IsError || !strings.Contains(txt, "has no browser") || !strings.Contains(txt, `image "browser"`) {
		t.Errorf("navigate in a sandbox without a browser: %q", txt)
	}
	txt, res = call(t, cs, "browser_tabs", map[string]any{"sandbox_id": "sb-nope"})
	if !res.IsError || !strings.Contains(txt, "not found") {
		t.Errorf("tabs of a missing sandbox: %q", txt)
	}
}

// startChromium starts a headless Chromium (Debian's, a dependency that
// scripts/deps.sh installs) with its DevTools on a loopback port, and
// returns that address. It ends with the test.
func startChromium(t *testing.T) string {
	t.Helper()
	testutil.NeedTool(t, "chromium", "Debian's chromium: scripts/deps.sh (make deps) installs it")
	cmd := exec.Command("chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
		"--window-size=1280,800", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--user-data-dir="+t.TempDir(), "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	var log testutil.Buffer
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			_, _ = log.Write([]byte(line + "\n"))
			if rest, ok := strings.CutPrefix(line, "DevTools listening on "); ok {
				if u, err := url.Parse(rest); err == nil {
					addr <- u.Host
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case a := <-addr:
		return a
	case <-done:
		t.Fatalf("chromium exited: %s", log.String())
	case <-time.After(time.Minute):
		t.Fatalf("chromium did not listen in a minute: %s", log.String())
	}
	return ""
}

// testSite serves the pages of TestBrowserTools.
func testSite(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	page := func(path, body string) {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, body)
		})
	}
	page("/form.html", `<!doctype html><title>Form test</title>
<h1>Form test</h1>
<form id="f"><label>Name <input id="name" required></label> <button id="greet" type="submit">Greet</button></form>
<p id="out"></p>
<button id="alert" onclick="alert('careful'); document.getElementById('out').textContent = 'alerted'">Alert me</button>
<a href="/next.html">Next page</a> <a href="/next.html" target="_blank">Elsewhere</a>
<div style="height: 5000px"></div><p id="bottom">The end</p>
<script>
document.getElementById('f').addEventListener('submit', e => {
  e.preventDefault();
  document.getElementById('out').textContent = 'Hello, ' + document.getElementById('name').value + '!';
});
</script>`)
	page("/next.html", `<!doctype html><title>Next</title><p>You arrived.</p>`)
	page("/long.html", `<!doctype html><title>Long</title><pre>`+strings.Repeat("0123456789 ", 20000)+`</pre>`)
	mux.HandleFunc("/file.txt", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, "download me\n")
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/file.txt", http.StatusFound) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// refOf finds the ref of the element role "name" in a snapshot.
func refOf(txt, role, name string) string {
	m := regexp.MustCompile(`\[(e\d+)\] ` + regexp.QuoteMeta(role+` "`+name+`"`)).FindStringSubmatch(txt)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestBrowserTools drives a real Chromium (on the host, as the fake's
// browser sandbox) through every browser tool over MCP.
func TestBrowserTools(t *testing.T) {
	addr := startChromium(t)
	site := testSite(t)
	dl := t.TempDir()
	old := browserDownloadDir
	browserDownloadDir = dl
	t.Cleanup(func() { browserDownloadDir = old })
	f := newFake()
	f.browserAddr = addr
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	ended := false
	defer func() {
		if !ended {
			end()
		}
	}()
	must := func(tool string, args map[string]any) (string, *sdk.CallToolResult) {
		t.Helper()
		txt, res := call(t, cs, tool, args)
		if res.IsError {
			t.Fatalf("%s %v: %s", tool, args, txt)
		}
		return txt, res
	}

	txt, _ := must("browser_navigate", map[string]any{"url": site.URL + "/form.html"})
	if !strings.Contains(txt, "HTTP 200") || !strings.Contains(txt, "title: Form test") || !strings.Contains(txt, "url: "+site.URL+"/form.html") {
		t.Errorf("navigate: %s", txt)
	}
	ids := f.ids()
	if len(ids) != 1 || !strings.Contains(txt, "sandbox_id: "+ids[0]) {
		t.Fatalf("sandboxes %v after the first browser call (%s); want the session's browser sandbox", ids, txt)
	}
	if sb, _ := f.blindGet(t.Context(), ids[0]); sb.Image != "browser" {
		t.Errorf("the session's browser sandbox is of image %q", sb.Image)
	}

	snap, _ := must("browser_snapshot", nil)
	box, greet, link := refOf(snap, "textbox", "Name"), refOf(snap, "button", "Greet"), refOf(snap, "link", "Next page")
	if box == "" || greet == "" || link == "" || !strings.Contains(snap, `heading "Form test" [level=1]`) {
		t.Fatalf("snapshot lacks the form's elements:\n%s", snap)
	}
	if snap2, _ := must("browser_snapshot", nil); refOf(snap2, "button", "Greet") != greet {
		t.Errorf("the button's ref changed between snapshots of one page:\n%s", snap2)
	}

	must("browser_type", map[string]any{"ref": box, "text": "Ada"})
	must("browser_click", map[string]any{"ref": greet})
	if txt, _ = must("browser_text", nil); !strings.Contains(txt, "Hello, Ada!") {
		t.Errorf("text after the click: %s", txt)
	}
	// Typing replaces; submit presses Enter (the form's submit handler).
	must("browser_type", map[string]any{"selector": "#name", "text": "Grace", "submit": true})
	if txt, _ = must("browser_eval", map[string]any{"expression": "document.getElementById('out').textContent"}); !strings.HasPrefix(txt, `"Hello, Grace!"`) {
		t.Errorf("eval after typing with submit: %s", txt)
	}
	if txt, _ = must("browser_text", map[string]any{"selector": "#out"}); !strings.Contains(txt, "\n\nHello, Grace!") {
		t.Errorf("text of #out: %s", txt)
	}
	if txt, _ = must("browser_eval", map[string]any{"expression": "Promise.resolve({a: [1, 2]})"}); !strings.HasPrefix(txt, `{"a":[1,2]}`) {
		t.Errorf("eval of a promise: %s", txt)
	}
	if txt, res := call(t, cs, "browser_eval", map[string]any{"expression": "throw new Error('nope')"}); !res.IsError || !strings.Contains(txt, "JavaScript exception") || !strings.Contains(txt, "nope") {
		t.Errorf("eval that throws: %s", txt)
	}
	if txt, res := call(t, cs, "browser_click", map[string]any{"selector": "#missing"}); !res.IsError || !strings.Contains(txt, "no element matches") {
		t.Errorf("click on a missing selector: %s", txt)
	}
	if txt, res := call(t, cs, "browser_click", map[string]any{"selector": "##"}); !res.IsError || !strings.Contains(txt, "selector") {
		t.Errorf("click on a bad selector: %s", txt)
	}
	if txt, res := call(t, cs, "browser_click", map[string]any{"ref": "e99999"}); !res.IsError || !strings.Contains(txt, "take a new browser_snapshot") {
		t.Errorf("click on an unknown ref: %s", txt)
	}

	// A dialog cannot hang a call: accepted and reported.
	if txt, _ = must("browser_click", map[string]any{"selector": "#alert"}); !strings.Contains(txt, `alert dialog said "careful"`) {
		t.Errorf("click that alerts: %s", txt)
	}

	// Press and scroll.
	must("browser_press", map[string]any{"key": "Control+A", "selector": "#name"})
	must("browser_press", map[string]any{"key": "Backspace"})
	if txt, _ = must("browser_eval", map[string]any{"expression": "document.getElementById('name').value"}); !strings.HasPrefix(txt, `""`) {
		t.Errorf("the field after Control+A, Backspace: %s", txt)
	}
	must("browser_scroll", map[string]any{"dy": 800})
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		txt, _ := call(t, cs, "browser_eval", map[string]any{"expression": "window.scrollY"})
		return !strings.HasPrefix(txt, "0\n")
	}) {
		t.Error("the page did not scroll down")
	}
	must("browser_scroll", map[string]any{"selector": "#bottom"})
	if txt, _ = must("browser_eval", map[string]any{"expression": "window.scrollY > 4000"}); !strings.HasPrefix(txt, "true") {
		t.Errorf("scrolled into view: scrollY > 4000 is %s", txt)
	}

	// A screenshot is a PNG image.
	_, res := must("browser_screenshot", nil)
	var png []byte
	for _, c := range res.Content {
		if img, ok := c.(*sdk.ImageContent); ok && img.MIMEType == "image/png" {
			png = img.Data
		}
	}
	if len(png) < 1000 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("screenshot: %d bytes of PNG", len(png))
	}
	_, res = must("browser_screenshot", map[string]any{"full_page": true})
	if w, h, ok := pngSize(res.Content[len(res.Content)-1].(*sdk.ImageContent).Data); !ok || h <= w {
		t.Errorf("full-page screenshot of a tall page is %dx%d", w, h)
	}

	// A click that loads another page waits for it; the old refs are then
	// stale.
	if txt, _ = must("browser_click", map[string]any{"ref": link}); !strings.Contains(txt, "title: Next") {
		t.Errorf("click on a link: %s", txt)
	}
	if txt, res := call(t, cs, "browser_click", map[string]any{"ref": greet}); !res.IsError || !strings.Contains(txt, "take a new browser_snapshot") {
		t.Errorf("click on a ref of the page before: %s", txt)
	}

	// Text past the cap is cut with a note.
	must("browser_navigate", map[string]any{"url": site.URL + "/long.html"})
	if txt, _ = must("browser_text", nil); len(txt) > 64<<10 || !strings.Contains(txt, "[text cut:") {
		t.Errorf("text of a long page: %d bytes, ends %q", len(txt), txt[max(len(txt)-200, 0):])
	}
	if txt, _ = must("browser_eval", map[string]any{"expression": "'x'.repeat(200000)"}); len(txt) > 64<<10 || !strings.Contains(txt, "[result cut:") {
		t.Errorf("a long eval result: %d bytes", len(txt))
	}
	if txt, res := call(t, cs, "browser_navigate", map[string]any{"url": "http://" + closedPort(t) + "/"}); !res.IsError || !strings.Contains(txt, "ERR_CONNECTION_REFUSED") {
		t.Errorf("navigate to a closed port: %s", txt)
	}

	// Tabs.
	must("browser_navigate", map[string]any{"url": site.URL + "/form.html"})
	if txt, _ = must("browser_click", map[string]any{"selector": "a[target=_blank]"}); !strings.Contains(txt, "opened a new tab") {
		t.Errorf("click on a link to a new tab: %s", txt)
	}
	tabs := func() []tabView {
		t.Helper()
		txt, _ := must("browser_tabs", nil)
		var out struct{ Tabs []tabView }
		if err := json.Unmarshal([]byte(txt), &out); err != nil {
			t.Fatalf("tabs: %s", txt)
		}
		return out.Tabs
	}
	if ts := tabs(); len(ts) != 2 || !ts[0].Current || ts[1].Current {
		t.Errorf("tabs after the page opened one: %+v", ts)
	}
	if txt, _ = must("browser_tab_new", map[string]any{"url": site.URL + "/next.html"}); !strings.Contains(txt, "title: Next") || !strings.Contains(txt, "tab: 2") {
		t.Errorf("new tab: %s", txt)
	}
	if ts := tabs(); len(ts) != 3 || !ts[2].Current {
		t.Errorf("tabs after a new one: %+v", ts)
	}
	if txt, _ = must("browser_tab_switch", map[string]any{"index": 0}); !strings.Contains(txt, "title: Form test") {
		t.Errorf("switch to tab 0: %s", txt)
	}
	if txt, res := call(t, cs, "browser_tab_switch", map[string]any{"index": 7}); !res.IsError || !strings.Contains(txt, "no tab 7") {
		t.Errorf("switch to tab 7: %s", txt)
	}
	must("browser_tab_close", map[string]any{"index": 2})
	must("browser_tab_close", map[string]any{"index": 1})
	if ts := tabs(); len(ts) != 1 || !ts[0].Current || ts[0].Title != "Form test" {
		t.Errorf("tabs after closing two: %+v", ts)
	}

	// Downloads: what the browser would show is saved; HTTP errors are
	// errors.
	for _, u := range []string{"/file.txt", "/moved"} {
		txt, _ = must("browser_download", map[string]any{"url": site.URL + u})
		var d downloadResult
		if err := json.Unmarshal([]byte(txt), &d); err != nil || filepath.Dir(d.Path) != dl || d.Size != 12 {
			t.Fatalf("download %s: %s", u, txt)
		}
		if b, err := os.ReadFile(d.Path); err != nil || string(b) != "download me\n" {
			t.Errorf("the downloaded file %s: %q, %v", d.Path, b, err)
		}
	}
	if txt, res := call(t, cs, "browser_download", map[string]any{"url": site.URL + "/nothing-here"}); !res.IsError || !strings.Contains(txt, "HTTP 404") {
		t.Errorf("download of a missing file: %s", txt)
	}
	// With path, the file is moved there inside the sandbox (an exec).
	if txt, _ = must("browser_download", map[string]any{"url": site.URL + "/file.txt", "path": "/root/got.txt"}); !strings.Contains(txt, `"path": "/root/got.txt"`) {
		t.Errorf("download to a path: %s", txt)
	}
	f.mu.Lock()
	argv := f.execs["abcdefghijklmnop"].Argv
	f.mu.Unlock()
	if len(argv) < 2 || argv[len(argv)-1] != "/root/got.txt" || !strings.HasPrefix(argv[len(argv)-2], dl+"/") {
		t.Errorf("the move's argv: %q", argv)
	}
	if tabs := tabs(); len(tabs) != 1 {
		t.Errorf("a download's tab stayed open: %+v", tabs)
	}

	// The session's end leaves the browser's tabs open (they are the
	// sandbox's).
	end()
	ended = true
	hc := &http.Client{Timeout: time.Minute}
	resp, err := hc.Get("http://" + addr + "/json/list")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), site.URL+"/form.html") {
		t.Errorf("the tab is gone after the session ended: %s", b)
	}
}

// TestBrowserIdleClose checks that a connection closes browserIdle after
// its last call (a call in between starts the wait again), and that the
// session's end closes the rest and refuses new calls.
func TestBrowserIdleClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			b  browsers
			mu sync.Mutex // the timers' goroutines close
		)
		closedMap := map[string]int{}
		closed := func(id string) int { mu.Lock(); defer mu.Unlock(); return closedMap[id] }
		use := func(id string) {
			t.Helper()
			st, err := b.acquire(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if st.conn == nil {
				ctx, cancel := context.WithCancel(context.Background())
				st.conn = &browserConn{root: ctx, cancel: func() { cancel(); mu.Lock(); closedMap[id]++; mu.Unlock() }, tabs: map[target.ID]*attachedTab{}}
			}
			b.release(st)
		}
		use("a")
		use("b")
		time.Sleep(browserIdle - time.Second)
		use("a") // a's wait starts again
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if closed("a") != 0 || closed("b") != 1 {
			t.Errorf("after b's idle time: a closed %d times, b %d; want b once", closed("a"), closed("b"))
		}
		time.Sleep(browserIdle)
		synctest.Wait()
		if closed("a") != 1 {
			t.Errorf("after a's idle time: a closed %d times", closed("a"))
		}
		use("a") // reconnects
		use("c")
		b.close()
		if closed("a") != 2 || closed("c") != 1 || closed("b") != 1 {
			t.Errorf("after close: a, b, c closed %d, %d, %d times; want 2, 1, 1", closed("a"), closed("b"), closed("c"))
		}
		if _, err := b.acquire(t.Context(), "a"); err == nil || !strings.Contains(err.Error(), "session has ended") {
			t.Errorf("acquire after close: %v", err)
		}
		time.Sleep(2 * browserIdle) // no timer is left to fire
		synctest.Wait()
		if closed("a") != 2 {
			t.Errorf("a timer closed a connection after close: a closed %d times", closed("a"))
		}
	})
}
