package main

import (
	"context"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func mcpCmd(g *globals) *cobra.Command {
	var keep bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the Model Context Protocol on stdin/stdout (for AI agents)",
		Long: `Serve airlock's tools to one MCP client over stdio, as the local user.

Tools: sandbox_create, sandbox_list, sandbox_kill, sandbox_set_timeout, run_code,
exec, file_read, file_write, file_list, context_create, context_list, context_reset.
File tools act on paths inside a sandbox only; no tool reads or writes host files.
The sandboxes the session creates are removed when it ends, unless --keep-sandboxes.
The HTTP API (` + "`airlock serve`" + `) serves the same tools at /mcp (streamable HTTP,
Authorization: Bearer <API key>).

Example client config:
  {"mcpServers": {"airlock": {"command": "airlock", "args": ["mcp"]}}}`,
		Args: cobra.NoArgs,
		RunE: g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			h, err := mcp.New(mcp.Config{
				Service: mcpService{m}, Log: g.log, Version: version,
				KeepSandboxes: keep, DefaultTimeout: timeout,
			})
			if err != nil {
				return err
			}
			return h.ServeStdio(cmd.Context(), &mcp.StdioTransport{})
		}),
	}
	cmd.Flags().BoolVar(&keep, "keep-sandboxes", false, "leave the session's sandboxes to their timeout when it ends")
	cmd.Flags().DurationVar(&timeout, "call-timeout", 60*time.Second, "default deadline of one tool call")
	return cmd
}

// mountMCP serves the MCP tools at /mcp of s, as the caller of each
// request's API key (the manager checks its quotas). The returned func
// ends the sessions (removing their sandboxes).
func mountMCP(g *globals, s *api.Server, m *sandbox.Manager) (func(context.Context) error, error) {
	h, err := mcp.New(mcp.Config{Service: mcpService{m}, Log: g.log, Version: version})
	if err != nil {
		return nil, err
	}
	s.HandleAuthenticated("/mcp", h.HTTPHandler(func(r *http.Request) (mcp.Principal, bool) {
		return api.CallerOf(r.Context())
	}))
	return h.Close, nil
}

// mcpService is the manager as mcp.Service (with its catalog's snapshot
// reads).
type mcpService struct{ *sandbox.Manager }

var _ mcp.Service = mcpService{}
