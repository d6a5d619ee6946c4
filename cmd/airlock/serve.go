package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func serveCmd(g *globals) *cobra.Command {
	var listen, previewDomain string
	var drain time.Duration
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (sandboxes keep running when it stops)",
		Args:  cobra.NoArgs,
		RunE: g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			setOOMScoreAdj(g.log, oomAdjServe)
			// One secret of the state dir derives every per-sandbox token
			// (E2B's access tokens, preview tokens).
			secret, err := m.Store.Secret(cmd.Context(), "secret.tokens")
			if err != nil {
				return err
			}
			cfg := api.Config{Sandboxes: m, Files: m, Execs: m, Contexts: m, Ports: m, Snapshots: m, Events: m.Store, Keys: m.Store, Log: g.log,
				PreviewDomain: previewDomain, Secret: secret}
			s, err := api.New(cfg)
			if err != nil {
				return err
			}
			closeMCP, err := mountMCP(g, s, m)
			if err != nil {
				return err
			}
			if err := e2b.Register(s, e2b.Config{Sandboxes: m, Execs: m, Files: m, Contexts: m, Snapshots: m, Secret: secret, Limiter: s.AllowTenant,
				Domain: previewDomain, Log: g.log}); err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			srv, cut := s.NewHTTPServer(listen)
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			fmt.Fprintf(cmd.OutOrStdout(), "airlock API listening on http://%s\n", ln.Addr())
			select {
			case err := <-errc:
				return err
			case <-cmd.Context().Done():
			}
			// A graceful stop: no new connections; requests in flight (exec
			// streams too) run to their end for up to drain, then are cut
			// with a line that says so (their execs go on in the shims).
			g.log.Info("stopping: draining requests in flight", "drain", drain)
			ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), drain)
			defer cancel()
			err = closeMCP(ctx) // MCP first: its streams hold connections open
			if serr := srv.Shutdown(ctx); serr != nil {
				g.log.Warn("drain time is up: cutting the requests still in flight", "err", serr)
				cut()
				ctx2, cancel2 := context.WithTimeout(context.WithoutCancel(cmd.Context()), 5*time.Second)
				defer cancel2()
				if serr := srv.Shutdown(ctx2); serr != nil {
					err = errors.Join(err, srv.Close())
				}
			}
			if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7070", "address to listen on")
	cmd.Flags().StringVar(&previewDomain, "preview-domain", os.Getenv("AIRLOCK_PREVIEW_DOMAIN"), "serve port P of sandbox ID at http://P-ID.`DOMAIN`/ (a wildcard DNS name, or localhost:7070 with a Host header; env AIRLOCK_PREVIEW_DOMAIN); E2B's getHost returns such hosts")
	cmd.Flags().DurationVar(&drain, "drain", 30*time.Second, "on SIGTERM/SIGINT, how long requests in flight (exec streams too) may run before they are cut")
	return cmd
}
