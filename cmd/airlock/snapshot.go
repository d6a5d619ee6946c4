package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// forkBasePrefix names the manager's unlisted snapshots that forks start
// from: hidden unless --all.
const forkBasePrefix = "_fork-"

// snapshotView is a snapshot as the CLI prints it.
type snapshotView struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Tenant    string    `json:"tenant,omitempty"`
	Image     string    `json:"image"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int       `json:"memory_mb"`
	DiskMiB   int       `json:"disk_mb"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

func viewSnapshot(sn *airlock.Snapshot) snapshotView {
	return snapshotView{sn.Name, sn.ID, sn.SandboxID, sn.Tenant, sn.Image, sn.CPUs, sn.MemoryMB, sn.DiskMB, sn.SizeBytes, sn.CreatedAt.UTC()}
}

// snapshotLine is what `airlock snapshot ID --name N` prints.
func snapshotLine(v snapshotView) string {
	return fmt.Sprintf("%s %s %s", v.Name, v.ID, humanBytes(v.SizeBytes))
}

func printSnapshots(w io.Writer, sns []snapshotView, asJSON bool) error {
	if asJSON {
		return writeJSON(w, sns)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSANDBOX\tIMAGE\tCPUS\tMEMORY\tSIZE\tCREATED")
	for _, sn := range sns {
		name := sn.Name
		if sn.Tenant != "" {
			name = sn.Tenant + "/" + name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dM\t%s\t%s ago\n", name, sn.SandboxID, sn.Image, sn.CPUs, sn.MemoryMiB,
			humanBytes(sn.SizeBytes), time.Since(sn.CreatedAt).Round(time.Second))
	}
	return tw.Flush()
}

func snapshotCmd(g *globals) *cobra.Command {
	var name string
	var force bool
	run := g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
		ctx, cancel := lifecycleCtx(cmd)
		defer cancel()
		sn, err := c.Snapshot(ctx, args[0], name, force)
		if err != nil {
			return err
		}
		fmt.Fprintln(cmd.OutOrStdout(), snapshotLine(viewSnapshot(sn)))
		return nil
	})
	create := func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%w: give one sandbox id (or a subcommand: create, ls, rm, prune)", errdefs.ErrInvalid)
		}
		if name == "" {
			return fmt.Errorf("%w: --name is required", errdefs.ErrInvalid)
		}
		if strings.HasPrefix(name, forkBasePrefix) {
			return fmt.Errorf("%w: snapshot names starting with %q are reserved", errdefs.ErrInvalid, forkBasePrefix)
		}
		if err := sandbox.ValidateSnapshotName(name); err != nil {
			return err
		}
		return run(cmd, args)
	}
	long := `Save a running (or paused) sandbox's memory, processes and disk as a named snapshot;
the sandbox keeps running: it is saved while it runs (its guest stops only while its
memory is written out, and keeps its open TCP connections). Start sandboxes from it with
` + "`airlock create --from-snapshot NAME`" + ` (or run); each gets a fresh clock, RNG reseed and
its own network stack. A snapshot's disk backs the sandboxes made from it, so
` + "`airlock snapshot rm`" + ` refuses while they exist. Commands or code still running are
refused unless --force, which ends them. Sandboxes with secrets cannot be saved.`
	cmd := &cobra.Command{
		Use:   "snapshot ID --name NAME [--force] | snapshot ls|rm|prune",
		Short: "Save a sandbox as a named snapshot (it keeps running); list, remove, prune snapshots",
		Long:  long,
		Args:  cobra.ArbitraryArgs,
		RunE:  create,
	}
	createSub := &cobra.Command{
		Use:   "create ID --name NAME [--force]",
		Short: "Save a sandbox as a named snapshot (same as `airlock snapshot ID --name NAME`)",
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE:  create,
	}
	for _, c := range []*cobra.Command{cmd, createSub} {
		c.Flags().StringVar(&name, "name", "", "the snapshot's name: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
		c.Flags().BoolVar(&force, "force", false, "end commands and code still running instead of refusing")
	}
	cmd.AddCommand(createSub, snapshotLsCmd(g), snapshotRmCmd(g), snapshotPruneCmd(g))
	return cmd
}

func snapshotLsCmd(g *globals) *cobra.Command {
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "ls [--json] [--all]",
		Short: "List snapshots: name, source sandbox, image, size, age",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			sns, err := c.ListSnapshotsIn(cmd.Context(), airlock.Scope{All: all})
			if err != nil {
				return err
			}
			vs := []snapshotView{}
			for i := range sns {
				v := viewSnapshot(&sns[i])
				v.Tenant = "" // the key's own
				vs = append(vs, v)
			}
			return printSnapshots(cmd.OutOrStdout(), vs, asJSON)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&all, "all", false, "every tenant's snapshots, and the unlisted ones forks start from (local only)")
	return cmd
}

func snapshotRmCmd(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "rm NAME [NAME...]",
		Short: "Remove snapshots and free their disk (refused while sandboxes made from them exist)",
		Args:  cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			return forEachID(cmd, "snapshot rm", args, func(name string) error {
				if err := c.DeleteSnapshotIn(cmd.Context(), airlock.Scope{Tenant: tenant}, name); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
				return nil
			})
		}),
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant whose snapshots these are (local only; default: the local user's)")
	return cmd
}

func snapshotPruneCmd(g *globals) *cobra.Command {
	report := func(cmd *cobra.Command, freed int64) {
		fmt.Fprintf(cmd.OutOrStdout(), "freed %s (%d bytes)\n", humanBytes(freed), freed)
	}
	return &cobra.Command{
		Use:   "prune",
		Short: "Remove the snapshots forks started from once unused, and orphaned snapshot files",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			freed, err := c.PruneSnapshots(cmd.Context())
			if err != nil {
				return err
			}
			report(cmd, freed)
			return nil
		}),
	}
}

func forkCmd(g *globals) *cobra.Command {
	var count int
	var force, secrets bool
	cmd := &cobra.Command{
		Use:   "fork ID [--count N] [--force] [--secrets]",
		Short: "Make running copies of a live sandbox and print their ids, one per line",
		Long: `Make N (1-16) running copies of a sandbox: processes, memory and disk as they are now,
each with a fresh clock, RNG reseed and its own network stack. The source is saved while
it runs (its guest stops only while its memory is written out, and keeps its open TCP
connections). The copies
have the source's size, image, env, network, metadata and lifetime. All or nothing: if one
copy fails, none is left. Commands running in the source go on in it and in each copy
(under the same exec ids: airlock attach); code running in the source refuses the fork
unless --force, which ends it and the commands. A copy of a sandbox with secrets binds the
source's values only with --secrets; without it the copy's guest holds placeholders that
reach no one.`,
		Example: "  airlock fork $id --count 3\n  airlock fork $id --secrets",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			ctx, cancel := lifecycleCtx(cmd)
			defer cancel()
			forks, err := c.ForkWith(ctx, args[0], airlock.ForkOptions{Count: count, Force: force, Secrets: secrets})
			if err != nil {
				return err
			}
			for _, f := range forks {
				fmt.Fprintln(cmd.OutOrStdout(), f.ID)
			}
			return nil
		}),
	}
	cmd.Flags().IntVar(&count, "count", 1, "how many copies (1-16)")
	cmd.Flags().BoolVar(&force, "force", false, "end code (and commands) still running in the source instead of refusing")
	cmd.Flags().BoolVar(&secrets, "secrets", false, "bind the source's secret values in each copy")
	return cmd
}
