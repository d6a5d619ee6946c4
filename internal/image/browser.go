package image

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// BrowserSource is the browser image's source; its revision changes with
// the recipe (BrowserPackages, the launcher). r2: socat relays DevTools
// (Python's asyncio took over 30 s to start under TCG).
const BrowserSource = "mmdebstrap:" + baseSuite + "+browser-r2"

// BrowserPackages make the browser image: Debian's Chromium, a virtual
// screen (Xvfb) shown over VNC (x11vnc) to noVNC in a web page
// (websockify), fonts for Latin, CJK and emoji text, certutil to trust the
// egress proxy's CA in Chromium's own certificate database, and socat to
// relay Chromium's DevTools port (which listens on loopback only).
var BrowserPackages = []string{
	"bash", "coreutils", "procps", "ca-certificates", "curl", "python3",
	"chromium", "xvfb", "x11vnc", "novnc", "python3-websockify", "libnss3-tools", "socat",
	"fonts-dejavu-core", "fonts-noto-cjk", "fonts-noto-color-emoji",
}

// BrowserRecipe is the browser image (`airlock image build browser`).
var BrowserRecipe = Recipe{
	Name: "browser", Source: BrowserSource, Packages: BrowserPackages,
	Finish: finishBrowserTree,
	Smoke: func(ctx context.Context, rootfs string) error {
		return chrootSmoke(ctx, rootfs, "Chromium ", "/usr/lib/chromium/chromium", "--version")
	},
}

// IsBrowser reports whether an image's source is the browser recipe (of
// any revision).
func IsBrowser(source string) bool {
	return strings.HasPrefix(source, "mmdebstrap:"+baseSuite+"+browser-")
}

// BrowserLauncher is the path of the launcher in the browser image. Run as
// root, `airlock-browser start` starts the screen, Chromium as the user
// "browser", the CDP relay and the view, each once, and prints one JSON
// line (BrowserStatus in package sandbox) when Chromium answers.
const BrowserLauncher = "/usr/local/bin/airlock-browser"

// browserUID is the unprivileged user Chromium runs as.
const browserUID = 1000

const browserPolicy = `{
  "DnsOverHttpsMode": "off",
  "BrowserSignin": 0,
  "SyncDisabled": true,
  "MetricsReportingEnabled": false,
  "PasswordManagerEnabled": false,
  "DefaultBrowserSettingEnabled": false,
  "PromotionalTabsEnabled": false
}
`

//go:embed browser/airlock-browser.py
var browserLauncher []byte

// finishBrowserTree adds the user "browser" (uid and gid 1000, home
// /home/browser) and the launcher.
func finishBrowserTree(rootfs string) error {
	for _, f := range []struct{ path, line string }{
		{"etc/passwd", fmt.Sprintf("browser:x:%d:%d:Chromium:/home/browser:/bin/bash\n", browserUID, browserUID)},
		{"etc/group", fmt.Sprintf("browser:x:%d:\n", browserUID)},
		{"etc/shadow", "browser:!:19000::::::\n"},
	} {
		if err := appendLine(filepath.Join(rootfs, f.path), f.line); err != nil {
			return err
		}
	}
	home := filepath.Join(rootfs, "home", "browser")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return err
	}
	if err := os.Chown(home, browserUID, browserUID); err != nil {
		return err
	}
	if err := os.Chmod(home, 0o700); err != nil {
		return err
	}
	// Managed policy: no DNS over HTTPS (the sandbox's resolver is the one
	// its egress policy pins), no sign-in, sync, metrics or password
	// manager.
	pol := filepath.Join(rootfs, "etc", "chromium", "policies", "managed")
	if err := os.MkdirAll(pol, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(pol, "airlock.json"), []byte(browserPolicy), 0o644); err != nil {
		return err
	}
	p := filepath.Join(rootfs, strings.TrimPrefix(BrowserLauncher, "/"))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, browserLauncher, 0o755)
}

// appendLine appends line to a regular file of the tree (never through a
// symlink).
func appendLine(p, line string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w", p, errors.Join(fs.ErrInvalid, errors.New("not a regular file")))
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
