package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func serveCmd(g *globals) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (sandboxes keep running when it stops)",
		Args:  cobra.NoArgs,
		RunE: g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			cfg := api.Config{Sandboxes: m, Files: m, Execs: m, Contexts: m, Ports: m, Snapshots: m, Events: m.Store, Keys: m.Store, Log: g.log}
			s, err := api.New(cfg)
			if err != nil {
				return err
			}
			closeMCP, err := mountMCP(g, s, m)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			srv, _ := s.NewHTTPServer(listen)
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			fmt.Fprintf(cmd.OutOrStdout(), "airlock API listening on http://%s\n", ln.Addr())
			select {
			case err := <-errc:
				return err
			case <-cmd.Context().Done():
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 30*time.Second)
			defer cancel()
			err = errors.Join(closeMCP(ctx), srv.Shutdown(ctx)) // MCP first: its streams hold connections open
			if err != nil {
				err = errors.Join(err, srv.Close())
			}
			if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7070", "address to listen on")
	return cmd
}
