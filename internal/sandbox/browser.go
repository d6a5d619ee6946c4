package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/image"
)

// The browser of a sandbox made from the browser image (image.BrowserRecipe):
// its launcher (image.BrowserLauncher), run as root through an exec, starts
// Xvfb, Chromium as the user "browser", a relay that serves Chromium's
// DevTools port on the guest's address, and the live view (noVNC). Those
// processes outlive the exec; they live and die with the sandbox, and a
// pause, snapshot or fork keeps them (and so the browser's tabs, cookies and
// sessions) as it keeps every process.

// Guest ports of the browser (see the launcher).
const (
	BrowserCDPPort         uint16 = 9222
	BrowserViewPort        uint16 = 6080
	BrowserInteractivePort uint16 = 6081
)

// BrowserMemoryMiB is the memory a sandbox of the browser image gets when
// the create names none: Chromium with a few tabs dies of OOM in the
// default 512 MiB.
const BrowserMemoryMiB = 2048

// browserStartTimeout bounds the launcher: Chromium's first start under
// QEMU's TCG takes about a minute.
const browserStartTimeout = 5 * time.Minute

// BrowserStatus is the launcher's report.
type BrowserStatus struct {
	Running bool `json:"running"`
	// CDPPort is the guest port of Chromium's DevTools (0 if down).
	CDPPort uint16 `json:"cdp_port"`
	// ViewPort serves noVNC and its WebSocket, view-only (0 if down).
	ViewPort uint16 `json:"view_port"`
	// InteractivePort is the same with keyboard and mouse (0 unless asked
	// for).
	InteractivePort uint16 `json:"interactive_port"`
	// Browser is Chromium's product string ("Chrome/150.0...").
	Browser string `json:"browser"`
	// Protocol is the DevTools protocol's version.
	Protocol string `json:"protocol"`
	// Sandbox is whether Chromium's own sandbox is on (it is when the guest
	// kernel allows it).
	Sandbox bool `json:"sandbox"`
	PID     int  `json:"pid"`
}

// ErrNoBrowser is the answer for a sandbox whose image has no launcher.
var ErrNoBrowser = fmt.Errorf("%w: this sandbox has no browser: create one from the image \"browser\" "+
	"(which 'airlock setup --browser' builds)", errdefs.ErrFailedPrecondition)

// BrowserView says what a browser start waits for besides Chromium.
type BrowserView int

const (
	// ViewBackground: the view-only live view goes on starting after the
	// answer.
	ViewBackground BrowserView = iota
	// ViewWait: the answer waits for the view-only live view too.
	ViewWait
	// ViewInteractive: and for the live view with keyboard and mouse.
	ViewInteractive
)

// launcherFlag is the launcher's start flag for v.
func (v BrowserView) launcherFlag() string {
	switch v {
	case ViewWait:
		return "--view"
	case ViewInteractive:
		return "--interactive"
	}
	return ""
}

// StartBrowser starts the browser of c's sandbox id where it is not
// running, with the live view as v says, and returns its status.
// Idempotent: the launcher serializes starts.
func (m *Manager) StartBrowser(ctx context.Context, c Caller, id string, v BrowserView) (BrowserStatus, error) {
	argv := []string{image.BrowserLauncher, "start"}
	if f := v.launcherFlag(); f != "" {
		argv = append(argv, f)
	}
	st, err := m.browserCommand(ctx, c, id, argv)
	if err != nil {
		return st, err
	}
	if !st.Running || st.CDPPort == 0 {
		return st, fmt.Errorf("%w: the browser did not start", errdefs.ErrUnavailable)
	}
	m.audit(ctx, c, id, "browser.start", map[string]any{"browser": st.Browser, "sandbox": st.Sandbox, "view": v != ViewBackground, "interactive": v == ViewInteractive})
	return st, nil
}

// BrowserStatus returns the status of c's sandbox's browser without
// starting it.
func (m *Manager) BrowserStatus(ctx context.Context, c Caller, id string) (BrowserStatus, error) {
	return m.browserCommand(ctx, c, id, []string{image.BrowserLauncher, "status"})
}

// browserCommand runs the launcher and reads its JSON line.
func (m *Manager) browserCommand(ctx context.Context, c Caller, id string, argv []string) (BrowserStatus, error) {
	st, err := m.Exec(ctx, c, id, guest.ExecSpec{
		Argv:    argv,
		Timeout: browserStartTimeout,
		// Chromium's processes and threads stay in the launcher's exec
		// cgroup; the sandbox's own limit still holds.
		PidsLimit:      1 << 15,
		MaxOutputBytes: 64 << 10,
	}, true)
	if se, ok := guest.AsStartError(err); ok && se.NotFound {
		return BrowserStatus{}, ErrNoBrowser // no launcher in this image
	}
	if err != nil {
		return BrowserStatus{}, err
	}
	defer st.Close()
	var stdout, stderr bytes.Buffer
	exit, err := guest.Drain(st, &stdout, &stderr)
	if err != nil {
		return BrowserStatus{}, err
	}
	msg := strings.TrimSpace(stderr.String())
	switch {
	case exit.Code == 127: // a shell's "not found" (the launcher itself never exits so)
		return BrowserStatus{}, ErrNoBrowser
	case exit.TimedOut:
		return BrowserStatus{}, fmt.Errorf("%w: the browser did not start in %s", errdefs.ErrUnavailable, browserStartTimeout)
	case exit.Code != 0 && exit.Code != 3:
		return BrowserStatus{}, fmt.Errorf("%w: starting the browser failed (exit %d): %s", errdefs.ErrUnavailable, exit.Code, lastLine(msg, 600))
	}
	out := strings.TrimSpace(stdout.String())
	var bs BrowserStatus
	if err := json.Unmarshal([]byte(lastLine(out, 4096)), &bs); err != nil {
		return BrowserStatus{}, fmt.Errorf("%w: the browser launcher answered %q", errdefs.ErrUnavailable, lastLine(out, 200))
	}
	return bs, nil
}

// DialBrowser opens a TCP stream to the DevTools port of c's sandbox's
// browser, starting the browser first if nothing answers.
func (m *Manager) DialBrowser(ctx context.Context, c Caller, id string) (net.Conn, error) {
	return m.dialBrowserPort(ctx, c, id, BrowserCDPPort, ViewBackground)
}

// DialBrowserView opens a TCP stream to the live view (noVNC and its
// WebSocket), view-only unless interactive, starting the browser first if
// nothing answers.
func (m *Manager) DialBrowserView(ctx context.Context, c Caller, id string, interactive bool) (net.Conn, error) {
	if interactive {
		return m.dialBrowserPort(ctx, c, id, BrowserInteractivePort, ViewInteractive)
	}
	return m.dialBrowserPort(ctx, c, id, BrowserViewPort, ViewWait)
}

func (m *Manager) dialBrowserPort(ctx context.Context, c Caller, id string, port uint16, v BrowserView) (net.Conn, error) {
	conn, err := m.DialPort(ctx, c, id, port)
	if err == nil {
		return conn, nil
	}
	if !errors.Is(err, errdefs.ErrUnavailable) {
		return nil, err
	}
	if _, err := m.StartBrowser(ctx, c, id, v); err != nil {
		return nil, err
	}
	return m.DialPort(ctx, c, id, port)
}

// lastLine is the last line of s, at most n bytes of it.
func lastLine(s string, n int) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}
