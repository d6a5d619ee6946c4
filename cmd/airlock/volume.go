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

const volumeLong = `Named volumes: filesystems of a fixed size that outlive sandboxes.

A sandbox mounts volumes at create (` + "`airlock run|create -v NAME:/path[:ro|rw]`" + `), for its
whole life. A volume is mounted read-write by one sandbox at a time, or read-only by any
number of sandboxes, never both: it is one ext4 filesystem, and only one kernel may write
it while no other reads it. A guest that fills a volume fills only that volume. Volumes
count against the tenant's max_volumes and, with their full size, max_disk_mb. Remove and
resize are refused while a sandbox (in any state) has the volume mounted.`

func volumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Create, list, inspect, resize and remove named volumes",
		Long:  volumeLong,
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(volumeCreateCmd(g), volumeLsCmd(g), volumeInspectCmd(g), volumeResizeCmd(g), volumeRmCmd(g))
	return cmd
}

// volumeSize reads --size for a volume.
func volumeSize(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: --size is required (e.g. --size 10G)", errdefs.ErrInvalid)
	}
	mib, err := parseMiB(s)
	if err != nil {
		return 0, fmt.Errorf("--size: %w", err)
	}
	if mib < sandbox.MinVolumeMiB {
		return 0, fmt.Errorf("%w: --size %s: a volume is at least %d MiB", errdefs.ErrInvalid, s, sandbox.MinVolumeMiB)
	}
	return mib, nil
}

func volumeCreateCmd(g *globals) *cobra.Command {
	var size string
	cmd := &cobra.Command{
		Use:   "create NAME --size SIZE",
		Short: "Create an empty volume of a fixed size and print its name",
		Args:  cobra.ExactArgs(1),
		PreRunE: func(_ *cobra.Command, args []string) error {
			if err := sandbox.ValidateVolumeName(args[0]); err != nil {
				return err
			}
			_, err := volumeSize(size)
			return err
		},
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			mib, _ := volumeSize(size)
			v, err := c.CreateVolume(cmd.Context(), args[0], mib)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.Name)
			return nil
		}),
	}
	cmd.Flags().StringVar(&size, "size", "", "its size (e.g. 512M, 10G; at least 16M); it can grow later, never shrink")
	return cmd
}

func printVolumes(w io.Writer, vs []airlock.Volume) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tMOUNTED BY\tCREATED")
	for _, v := range vs {
		var by []string
		for _, a := range v.Attachments {
			mode := "rw"
			if a.ReadOnly {
				mode = "ro"
			}
			by = append(by, a.SandboxID+":"+a.Path+":"+mode)
		}
		mounted := "-"
		if len(by) > 0 {
			mounted = strings.Join(by, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\n", v.Name, humanBytes(int64(v.SizeMB)<<20), humanBytes(v.AllocatedBytes),
			mounted, time.Since(v.CreatedAt).Round(time.Second))
	}
	return tw.Flush()
}

func volumeLsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List volumes: name, size, space used on the host, the sandboxes that mount them",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			vs, err := c.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if vs == nil {
				vs = []airlock.Volume{}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), vs)
			}
			return printVolumes(cmd.OutOrStdout(), vs)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func volumeInspectCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect NAME [--json]",
		Short: "Show a volume: size, space used, the sandboxes that mount it",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), v)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "name:       %s\nid:         %s\nsize:       %s (%d MiB)\nused:       %s\ncreated:    %s\n",
				v.Name, v.ID, humanBytes(int64(v.SizeMB)<<20), v.SizeMB, humanBytes(v.AllocatedBytes), v.CreatedAt.UTC().Format(time.RFC3339))
			if v.GuestWritten {
				fmt.Fprintln(w, "written by: a microVM guest (gvisor sandboxes cannot mount it)")
			}
			if len(v.Attachments) == 0 {
				fmt.Fprintln(w, "mounted by: nothing")
			}
			for _, a := range v.Attachments {
				mode := "read-write"
				if a.ReadOnly {
					mode = "read-only"
				}
				fmt.Fprintf(w, "mounted by: %s at %s, %s\n", a.SandboxID, a.Path, mode)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func volumeResizeCmd(g *globals) *cobra.Command {
	var size string
	cmd := &cobra.Command{
		Use:   "resize NAME --size SIZE",
		Short: "Grow a volume no sandbox has mounted (its filesystem grows at the next mount)",
		Args:  cobra.ExactArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			_, err := volumeSize(size)
			return err
		},
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			mib, _ := volumeSize(size)
			v, err := c.ResizeVolume(cmd.Context(), args[0], mib)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", v.Name, humanBytes(int64(v.SizeMB)<<20))
			return nil
		}),
	}
	cmd.Flags().StringVar(&size, "size", "", "the new size (e.g. 20G): not smaller than the current one")
	return cmd
}

func volumeRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME [NAME...]",
		Short: "Remove volumes and their data (refused while a sandbox has one mounted)",
		Args:  cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			return forEachID(cmd, "volume rm", args, func(name string) error {
				if err := c.DeleteVolume(cmd.Context(), name); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
				return nil
			})
		}),
	}
}
