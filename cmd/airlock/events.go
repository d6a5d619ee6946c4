package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

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
net.secret.inject, net.secret.block, ...), the connections into it
(net.inbound: a published port or the preview route, with the guest port,
the peer's address, bytes each way and the duration; past a burst,
folded into counted rows per port) and the programs the guest ran
(proc.exec with pid, ppid, uid, program, argv and cwd; proc.exit with the
exit code or signal; past a burst, folded into counted rows per program;
best effort: the guest reports them).

  airlock events ID --type net     every network decision of sandbox ID
  airlock events ID --type net.inbound   every connection into sandbox ID
  airlock events ID --type proc    every program sandbox ID's guest ran`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			f, err := filter(args)
			if err != nil {
				return err
			}
			return listEvents(cmd, c, f)
		}),
	}
	cmd.Flags().StringVar(&f.SandboxID, "sandbox", "", "only events of this sandbox (same as the ID argument)")
	cmd.Flags().StringVar(&f.Type, "type", "", "only actions TYPE or TYPE.* (e.g. net, exec, proc, net.deny)")
	cmd.Flags().Int64Var(&f.Since, "since", 0, "only events after this sequence number")
	cmd.Flags().IntVar(&f.Limit, "limit", 1000, "at most this many events (max 10000)")
	cmd.AddCommand(retentionCmd(g))
	return cmd
}

// retentionCmd shows or sets how long and how large the audit trail may
// grow (a catalog setting every process of this state dir applies).
func retentionCmd(g *globals) *cobra.Command {
	var maxAge, maxSize string
	var prune bool
	cmd := &cobra.Command{
		Use:   "retention",
		Short: "Show or set the audit trail's retention (local catalog)",
		Long: `Show or set how long and how large the audit trail may grow. Events older
than --max-age are deleted, and while the catalog's rows take more than
--max-size the oldest events are deleted (recorded as an audit.prune event).
Every airlock process of this state dir applies it as it appends events.
Defaults: 90d and 1G; 0 removes a bound.

  airlock events retention --max-age 30d --max-size 512M --prune`,
		Args: cobra.NoArgs,
		RunE: g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			ctx := cmd.Context()
			r, err := m.Store.Retention(ctx)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("max-age") {
				if r.MaxAge, err = parseAge(maxAge); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("max-size") {
				mib := 0
				if maxSize != "0" {
					if mib, err = parseMiB(maxSize); err != nil {
						return err
					}
				}
				r.MaxBytes = int64(mib) << 20
			}
			if cmd.Flags().Changed("max-age") || cmd.Flags().Changed("max-size") {
				if err := m.Store.SetRetention(ctx, r); err != nil {
					return fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
				}
			}
			out := cmd.OutOrStdout()
			if prune {
				n, err := m.Store.PruneEvents(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "pruned %d events\n", n)
			}
			used, err := m.Store.UsedBytes(ctx)
			if err != nil {
				return err
			}
			age, size := "none", "none"
			if r.MaxAge > 0 {
				age = fmt.Sprintf("%gd", r.MaxAge.Hours()/24)
			}
			if r.MaxBytes > 0 {
				size = humanBytes(r.MaxBytes)
			}
			fmt.Fprintf(out, "max age: %s\nmax size: %s\ncatalog in use: %s\n", age, size, humanBytes(used))
			return nil
		}),
	}
	cmd.Flags().StringVar(&maxAge, "max-age", "", "delete events older than this (e.g. 90d, 36h; 0: keep)")
	cmd.Flags().StringVar(&maxSize, "max-size", "", "bound on the catalog's size, oldest events deleted first (e.g. 1G; 0: none)")
	cmd.Flags().BoolVar(&prune, "prune", false, "apply the retention now")
	return cmd
}

// parseAge parses 90d, 36h, 90m or 0.
func parseAge(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 || n > 100*365 {
			return 0, fmt.Errorf("%w: age %q (use e.g. 90d or 36h)", errdefs.ErrInvalid, s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return parseDuration(s)
}
