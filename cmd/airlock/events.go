package main

import (
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func eventsCmd(g *globals) *cobra.Command {
	var f store.EventFilter
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the audit trail (JSON lines)",
		Args:  cobra.NoArgs,
		RunE: g.localOrRemote(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
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
		}, func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			return remoteEvents(cmd, c, f)
		}),
	}
	cmd.Flags().StringVar(&f.SandboxID, "sandbox", "", "only events of this sandbox")
	cmd.Flags().Int64Var(&f.Since, "since", 0, "only events after this sequence number")
	cmd.Flags().IntVar(&f.Limit, "limit", 1000, "at most this many events (max 10000)")
	return cmd
}
