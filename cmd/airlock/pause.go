package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// lifecycleTimeout bounds one pause or resume. Neither is abandoned on ^C:
// a save or restore cut half-way helps nobody.
const lifecycleTimeout = 5 * time.Minute

func lifecycleCtx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(cmd.Context()), lifecycleTimeout)
}

// forEachID runs fn on every id, reporting failures on stderr as "airlock:
// VERB ID: ERR"; any failure makes the exit status 1.
func forEachID(cmd *cobra.Command, verb string, ids []string, fn func(id string) error) error {
	var failed int
	for _, id := range ids {
		if err := fn(id); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", verb, id+":", apiMsg(err))
			failed++
		}
	}
	if failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}

// pausedLine is what `airlock pause` prints for one sandbox.
func pausedLine(id string, stateBytes int64, save time.Duration) string {
	if stateBytes == 0 && save == 0 {
		return "paused " + id + " (it already was)"
	}
	return fmt.Sprintf("paused %s (%d MiB state, saved in %.1f s)", id, (stateBytes+(1<<20)-1)>>20, save.Seconds())
}

func resumedLine(id string, took time.Duration) string {
	return fmt.Sprintf("resumed %s (in %.1f s)", id, took.Seconds())
}

func pauseCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "pause [--force] ID [ID...]",
		Short: "Save sandboxes (memory, devices, disk) to disk and free their RAM",
		Long: `Save sandboxes (memory, devices, disk) to disk and free their RAM; their state becomes
paused. Any later call (exec, code, cp, ...) or ` + "`airlock resume`" + ` restores them with every
process as it was. Open TCP connections of the guest are reset. Commands still running
are parked and go on after the resume (their ` + "`airlock exec`" + ` exits 75; ` + "`airlock attach ID EXEC`" + `
follows them again). Code runs or transfers in flight refuse the pause unless --force,
which ends them and the commands. A sandbox with secrets binds them again at the resume.
A paused sandbox's lifetime stands still (it counts running time only).`,
		Example: "  airlock pause $id\n  airlock pause --force $id $other",
		Args:    cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			return forEachID(cmd, "pause", args, func(id string) error {
				ctx, cancel := lifecycleCtx(cmd)
				defer cancel()
				res, err := c.Pause(ctx, id, force)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), pausedLine(id, res.StateBytes, res.SaveTime))
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&force, "force", false, "end commands and code still running instead of refusing")
	return cmd
}

func resumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "resume ID [ID...]",
		Short: "Restore paused sandboxes (any other call on them does it too)",
		Args:  cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			return forEachID(cmd, "resume", args, func(id string) error {
				ctx, cancel := lifecycleCtx(cmd)
				defer cancel()
				start := time.Now()
				if _, err := c.Resume(ctx, id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), resumedLine(id, time.Since(start)))
				return nil
			})
		}),
	}
}

func touchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "touch ID",
		Short: "Keepalive: count as activity for a sandbox's --idle-pause timer (resumes a paused one)",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			return c.Keepalive(cmd.Context(), args[0])
		}),
	}
}
