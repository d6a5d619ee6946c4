package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func eventsCmd(g *globals) *cobra.Command {
	var f store.EventFilter
	// filter folds the optional positional sandbox id into f.
	filter := func(args []string) (store.EventFilter, error) {
		if len(args) == 1 {
			if f.SandboxID != "" && f.SandboxID != args[0] {
				return f, fmt.Errorf("%w: sandbox %s given as an argument and %s with --sandbox", errdefs.ErrInvalid, args[0], f.SandboxID)
			}
			f.SandboxID = args[0]
		}
		return f, nil
	}
	cmd := &cobra.Command{
		Use:   "events [ID]",
		Short: "Print the audit trail (JSON lines)",
		Long: `Print the audit trail as JSON lines, oldest first: API and CLI actions
(sandbox.*, exec.*, file.*, code.run, context.*, auth.denied) and the sandbox
network's decisions (net.allow, net.deny with the rule or reason, net.dns,
net.secret.inject, net.secret.block, ...).

  airlock events ID --type net     every network decision of sandbox ID`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.localOrRemote(func(cmd *cobra.Command, m *sandbox.Manager, args []string) error {
			f, err := filter(args)
			if err != nil {
				return err
			}
			evs, err := m.Store.ListEvents(cmd.Context(), f)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			for _, e := range evs {
				if err := enc.Encode(e); err != nil {
					return err
				}
			}
			return nil
		}, func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			f, err := filter(args)
			if err != nil {
				return err
			}
			return remoteEvents(cmd, c, f)
		}),
	}
	cmd.Flags().StringVar(&f.SandboxID, "sandbox", "", "only events of this sandbox (same as the ID argument)")
	cmd.Flags().StringVar(&f.Type, "type", "", "only actions TYPE or TYPE.* (e.g. net, exec, net.deny)")
	cmd.Flags().Int64Var(&f.Since, "since", 0, "only events after this sequence number")
	cmd.Flags().IntVar(&f.Limit, "limit", 1000, "at most this many events (max 10000)")
	return cmd
}
