package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/browser"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func browserCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "browser",
		Short: "Drive the Chromium of a sandbox made from the browser image",
		Long: `Drive the Chromium of a sandbox made from the browser image:

  airlock image build browser                 # once: Debian's Chromium, Xvfb, noVNC, fonts
  id=$(airlock create --image browser)        # 2 GiB of memory unless --memory says otherwise
  airlock browser cdp $id                     # a DevTools endpoint on a loopback port for
                                              # Playwright or Puppeteer, until Ctrl-C
  airlock browser view $id                    # the live view (noVNC) on a loopback port
  airlock browser screenshot $id https://example.com -o page.png

Chromium starts on first use, as the guest user "browser", with its own sandbox
where the guest kernel allows it. Its traffic is the sandbox's: the egress
policy, DNS pinning, secrets and the audit trail apply.`,
	}
	cmd.AddCommand(browserStartCmd(g), browserStatusCmd(g), browserCDPCmd(g), browserViewCmd(g), browserScreenshotCmd(g))
	return cmd
}

func browserStartCmd(g *globals) *cobra.Command {
	var (
		o      airlock.BrowserOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "start ID",
		Short: "Start the sandbox's Chromium (if it is not running) and print where to reach it",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			b, err := c.StartBrowser(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			return printBrowser(b, asJSON)
		}),
	}
	cmd.Flags().BoolVar(&o.Interactive, "interactive", false, "also start the live view with keyboard and mouse")
	cmd.Flags().DurationVar(&o.SignedURLTTL, "signed-ttl", 0, "lifetime of the signed CDP URL (default 10m, at most 1h)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func browserStatusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status ID",
		Short: "Say whether the sandbox's Chromium runs (starts nothing)",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			b, err := c.BrowserStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printBrowser(b, asJSON)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printBrowser(b airlock.Browser, asJSON bool) error {
	if asJSON {
		return writeJSON(os.Stdout, b)
	}
	if !b.Running {
		fmt.Println("not running")
		return nil
	}
	sandboxed := "on"
	if !b.Sandbox {
		sandboxed = "off (the guest kernel does not allow it)"
	}
	fmt.Printf("browser:   %s (DevTools protocol %s), Chromium's sandbox %s\n", b.Browser, b.Protocol, sandboxed)
	fmt.Printf("cdp:       %s\n", b.CDPURL)
	if b.SignedCDPURL != "" {
		fmt.Printf("signed:    %s (until %s)\n", b.SignedCDPURL, b.SignedExpiresAt.Local().Format(time.TimeOnly))
	}
	if b.ViewURL != "" {
		fmt.Printf("view:      %s\n", b.ViewURL)
	}
	return nil
}

// listenLoopback listens on addr, which must be a loopback address, and
// returns a random path prefix that a request must start with.
func listenLoopback(addr string) (net.Listener, string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("%w: --listen %q: %v", errdefs.ErrInvalid, addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, "", fmt.Errorf("%w: --listen %q: only a loopback address (the endpoint drives the browser with your key)", errdefs.ErrInvalid, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	return ln, "/" + strings.ToLower(rand.Text()), nil
}

// serveUntilDone serves h on ln until ctx ends.
func serveUntilDone(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func browserCDPCmd(g *globals) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "cdp ID",
		Short: "Serve the sandbox's DevTools endpoint on a loopback port until interrupted",
		Long: `Start the sandbox's Chromium if needed and serve its DevTools endpoint on a
loopback port, under a random path, until interrupted. It prints two lines:

  ws://127.0.0.1:PORT/PATH     for Puppeteer: puppeteer.connect({browserWSEndpoint})
  http://127.0.0.1:PORT/PATH   for Playwright: chromium.connectOverCDP(url)

The endpoint acts with your credentials: anyone who has the URL drives the
browser while it is served.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			b, err := c.StartBrowser(cmd.Context(), args[0], airlock.BrowserOptions{})
			if err != nil {
				return err
			}
			ln, prefix, err := listenLoopback(listen)
			if err != nil {
				return err
			}
			addr := ln.Addr().String()
			fmt.Fprintf(os.Stderr, "%s: serving until Ctrl-C\n", b.Browser)
			fmt.Printf("ws://%s%s\nhttp://%s%s\n", addr, prefix, addr, prefix)
			return serveUntilDone(cmd.Context(), ln, c.BrowserProxy(args[0], prefix))
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "loopback address to serve on")
	return cmd
}

func browserViewCmd(g *globals) *cobra.Command {
	var (
		listen      string
		interactive bool
	)
	cmd := &cobra.Command{
		Use:   "view ID",
		Short: "Serve the live view of the sandbox's screen (noVNC) on a loopback port until interrupted",
		Long: `Start the sandbox's Chromium if needed and serve the live view of its screen
(noVNC, view-only unless --interactive) on a loopback port, under a random
path, until interrupted. Open the printed URL in a web browser.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			b, err := c.StartBrowser(cmd.Context(), args[0], airlock.BrowserOptions{View: true, Interactive: interactive})
			if err != nil {
				return err
			}
			port, viewOnly := b.ViewPort, "&view_only=1"
			if interactive {
				port, viewOnly = b.InteractivePort, ""
			}
			if port == 0 {
				return fmt.Errorf("%w: the sandbox's live view did not start", errdefs.ErrUnavailable)
			}
			ln, prefix, err := listenLoopback(listen)
			if err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "serving the live view until Ctrl-C")
			fmt.Printf("http://%s%s/vnc.html?autoconnect=1&resize=scale&path=%s%s\n", ln.Addr(), prefix, strings.TrimPrefix(prefix, "/")+"/websockify", viewOnly)
			return serveUntilDone(cmd.Context(), ln, c.PortProxy(args[0], port, prefix))
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "loopback address to serve on")
	cmd.Flags().BoolVar(&interactive, "interactive", false, "with keyboard and mouse")
	return cmd
}

func browserScreenshotCmd(g *globals) *cobra.Command {
	var (
		out      string
		fullPage bool
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "screenshot ID URL",
		Short: "Load URL in a new tab of the sandbox's Chromium and save a PNG of it",
		Args:  cobra.ExactArgs(2),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			if out == "" {
				return fmt.Errorf("%w: -o FILE is required", errdefs.ErrInvalid)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			connect := func(ctx context.Context) (chromedp.Transport, error) {
				ws, err := c.BrowserWebSocket(ctx, args[0])
				if err != nil {
					return nil, err
				}
				return browser.NewTransport(ws), nil
			}
			bctx, bcancel := browser.NewContext(ctx, connect)
			defer bcancel()
			shot := chromedp.CaptureScreenshot()
			if fullPage {
				shot = chromedp.FullScreenshot(100)
			}
			if err := chromedp.Do(bctx, chromedp.Navigate(args[1])); err != nil {
				return fmt.Errorf("load %s: %w", args[1], err)
			}
			png, err := chromedp.Run(bctx, shot)
			if err != nil {
				return fmt.Errorf("screenshot of %s: %w", args[1], err)
			}
			if err := os.WriteFile(out, png, 0o644); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%s: %d bytes\n", out, len(png))
			return nil
		}),
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "PNG file to write")
	cmd.Flags().BoolVar(&fullPage, "full-page", false, "the whole page, not only the window")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Minute, "give up after this long")
	return cmd
}
