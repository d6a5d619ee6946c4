package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func keysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage API keys (tenants and their limits)"}
	var catalog string
	cmd.PersistentFlags().StringVar(&catalog, "catalog", os.Getenv("AIRLOCK_CATALOG"),
		"the catalog `URL` of a cluster's control tier (postgres://...; env AIRLOCK_CATALOG) instead of the state dir's")
	// open is the state dir's manager, or only a store: the cluster's
	// catalog (the key commands use nothing else).
	open := func(ctx context.Context) (*sandbox.Manager, func(), error) {
		if catalog == "" {
			return g.manager(ctx)
		}
		st, err := store.Open(ctx, catalog)
		if err != nil {
			return nil, nil, err
		}
		return &sandbox.Manager{Store: st}, func() { st.Close() }, nil
	}
	var k store.APIKey
	create := &cobra.Command{
		Use:   "create --tenant T",
		Short: "Create an API key and print it (shown once; only its hash is kept)",
		Args:  cobra.NoArgs,
		RunE: withOpen(open, func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			_, key, err := m.Store.CreateKey(cmd.Context(), k)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), key)
			return nil
		}),
	}
	f := create.Flags()
	f.StringVar(&k.Tenant, "tenant", "", "tenant the key acts for (required)")
	f.BoolVar(&k.Admin, "admin", false, "the key sees and acts on every tenant's sandboxes")
	keyLimitFlags(create, &k)
	_ = create.MarkFlagRequired("tenant")

	var u store.APIKey
	update := &cobra.Command{
		Use:   "update ID [--max-... N] [--net-... N]",
		Short: "Change an API key's limits (only the flags given; network limits apply to sandboxes created from then on)",
		Args:  cobra.ExactArgs(1),
		RunE: withOpen(open, func(cmd *cobra.Command, m *sandbox.Manager, args []string) error {
			cur, err := m.Store.GetKey(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("%w: no key %q (see `airlock keys ls`)", errdefs.ErrNotFound, args[0])
			}
			for _, l := range []struct {
				flag      string
				dst, from *int
			}{
				{"max-sandboxes", &cur.MaxSandboxes, &u.MaxSandboxes}, {"max-vcpus", &cur.MaxVCPUs, &u.MaxVCPUs},
				{"max-memory-mb", &cur.MaxMemoryMiB, &u.MaxMemoryMiB}, {"max-disk-mb", &cur.MaxDiskMiB, &u.MaxDiskMiB},
				{"max-snapshots", &cur.MaxSnapshots, &u.MaxSnapshots}, {"max-volumes", &cur.MaxVolumes, &u.MaxVolumes},
				{"rate-per-min", &cur.RatePerMin, &u.RatePerMin}, {"net-conn-rate", &cur.NetConnRate, &u.NetConnRate},
				{"net-dests-per-min", &cur.NetDestsPerMin, &u.NetDestsPerMin}, {"net-udp-pps", &cur.NetUDPRate, &u.NetUDPRate},
			} {
				if cmd.Flags().Changed(l.flag) {
					*l.dst = *l.from
				}
			}
			return m.Store.UpdateKeyLimits(cmd.Context(), cur)
		}),
	}
	keyLimitFlags(update, &u)

	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List API keys (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: withOpen(open, func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			keys, err := m.Store.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]keyJSON, 0, len(keys))
				for _, k := range keys {
					out = append(out, keyJSON{ID: k.ID, Tenant: k.Tenant, Admin: k.Admin, Revoked: k.Revoked,
						MaxSandboxes: k.MaxSandboxes, MaxVCPUs: k.MaxVCPUs, MaxMemoryMiB: k.MaxMemoryMiB, MaxDiskMiB: k.MaxDiskMiB,
						MaxSnapshots: k.MaxSnapshots, MaxVolumes: k.MaxVolumes, RatePerMin: k.RatePerMin,
						NetConnRate: k.NetConnRate, NetDestsPerMin: k.NetDestsPerMin, NetUDPRate: k.NetUDPRate, Created: k.Created.UTC()})
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tADMIN\tREVOKED\tMAX_SANDBOXES\tMAX_VCPUS\tMAX_MEMORY_MB\tMAX_DISK_MB\tMAX_SNAPSHOTS\tMAX_VOLUMES\tRATE_PER_MIN\tNET_CONN_RATE\tNET_DESTS_PER_MIN\tNET_UDP_PPS\tCREATED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\t%t\t%t\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", k.ID, k.Tenant, k.Admin, k.Revoked,
					k.MaxSandboxes, k.MaxVCPUs, k.MaxMemoryMiB, k.MaxDiskMiB, k.MaxSnapshots, k.MaxVolumes, k.RatePerMin,
					k.NetConnRate, k.NetDestsPerMin, k.NetUDPRate, k.Created.UTC().Format("2006-01-02T15:04:05Z"))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key",
		Args:  cobra.ExactArgs(1),
		RunE: withOpen(open, func(cmd *cobra.Command, m *sandbox.Manager, args []string) error {
			return m.Store.RevokeKey(cmd.Context(), args[0])
		}),
	}
	cmd.AddCommand(create, update, ls, revoke)
	return cmd
}

// keyLimitFlags registers the limit flags of keys create and update on c,
// into k.
func keyLimitFlags(c *cobra.Command, k *store.APIKey) {
	f := c.Flags()
	f.IntVar(&k.MaxSandboxes, "max-sandboxes", 0, "live sandboxes of the tenant (0: server default)")
	f.IntVar(&k.MaxVCPUs, "max-vcpus", 0, "total vCPUs of the tenant's live sandboxes (0: server default)")
	f.IntVar(&k.MaxMemoryMiB, "max-memory-mb", 0, "total memory in MiB of the tenant's live sandboxes (0: server default)")
	f.IntVar(&k.MaxDiskMiB, "max-disk-mb", 0, "total disk in MiB of the tenant's sandboxes (their disk sizes) snapshots and volumes (0: server default, 65536)")
	f.IntVar(&k.MaxSnapshots, "max-snapshots", 0, "named snapshots the tenant may keep (0: server default, 100)")
	f.IntVar(&k.MaxVolumes, "max-volumes", 0, "named volumes the tenant may keep (0: server default, 20)")
	f.IntVar(&k.RatePerMin, "rate-per-min", 0, "API requests per minute for the tenant (0: server default)")
	f.IntVar(&k.NetConnRate, "net-conn-rate", 0, fmt.Sprintf("new outbound connections per second of each of the tenant's sandboxes, bursts of %dx (0: default %d; -1: no limit)", netconf.ConnBurstFactor, netconf.DefaultConnRate))
	f.IntVar(&k.NetDestsPerMin, "net-dests-per-min", 0, fmt.Sprintf("distinct destinations (address:port) per minute of each of the tenant's sandboxes (0: default %d; -1: no limit)", netconf.DefaultDestsPerMin))
	f.IntVar(&k.NetUDPRate, "net-udp-pps", 0, fmt.Sprintf("UDP datagrams per second each of the tenant's sandboxes may send (0: default %d; -1: no limit)", netconf.DefaultUDPRate))
}

// keyJSON is one key in `keys ls --json` (never its secret).
type keyJSON struct {
	ID           string `json:"id"`
	Tenant       string `json:"tenant"`
	Admin        bool   `json:"admin"`
	Revoked      bool   `json:"revoked"`
	MaxSandboxes int    `json:"max_sandboxes"`
	MaxVCPUs     int    `json:"max_vcpus"`
	MaxMemoryMiB int    `json:"max_memory_mb"`
	MaxDiskMiB   int    `json:"max_disk_mb"`
	MaxSnapshots int    `json:"max_snapshots"`
	MaxVolumes   int    `json:"max_volumes"`
	RatePerMin   int    `json:"rate_per_min"`
	// Network limits: 0 the default, -1 none.
	NetConnRate    int       `json:"net_conn_rate"`
	NetDestsPerMin int       `json:"net_dests_per_min"`
	NetUDPRate     int       `json:"net_udp_pps"`
	Created        time.Time `json:"created"`
}
