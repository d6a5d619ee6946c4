package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

const networkLong = `Show or change a sandbox's network.

` + "`network set`" + ` replaces the egress policy of a running or paused sandbox, whole: the
mode and the allow rules given are the new policy, and every rule not given is removed
(like E2B's network update). Secrets, published ports and limits stay as they were. The
rules take the syntax of ` + "`create --allow`" + ` and are checked the same way: a rule that opens
private, loopback, link-local or metadata addresses needs an admin key on a server.

A running sandbox enforces the new policy at once: new connections and DNS queries are
decided by it, and every open connection it would not allow is closed (each one is a
net.deny event, see ` + "`airlock events`" + `). A paused sandbox gets it when it resumes. Every
change is audited as sandbox.network with the old and new policy. A sandbox created with
--net none keeps no network; use --net deny without rules to cut off all egress.

` + "`network add-secret`" + ` and ` + "`network rm-secret`" + ` add a secret to, or remove one from, a
running or paused sandbox, in the syntax of ` + "`create --secret`" + `: NAME@host[,host] takes the
value of $NAME in airlock's own environment, vault:NAME[@host,...] the vault secret NAME
(` + "`airlock secret set`" + `). A running sandbox injects it into new requests to its hosts at
once (or stops: connections that were injected are closed), and new commands see its
placeholder in $NAME (commands already running keep their environment). The values are
sealed again, so pause and resume keep the new set; a paused sandbox gets it when it
resumes. Every change is audited as sandbox.secret.set or sandbox.secret.rm, by name.`

func networkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Show or change a sandbox's egress policy (while it runs)",
		Long:  networkLong,
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(networkGetCmd(g), networkSetCmd(g), networkAddSecretCmd(g), networkRmSecretCmd(g))
	return cmd
}

func networkGetCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print a sandbox's network: egress mode and rules, secrets (names), ports, limits",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			st, err := c.GetNetwork(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), viewAPINetwork(st.Network))
			}
			printNetwork(cmd.OutOrStdout(), st.Network)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func networkSetCmd(g *globals) *cobra.Command {
	var (
		mode   string
		allow  []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "set ID (--net public|deny | --allow RULE...)",
		Short: "Replace a sandbox's egress policy, whole, at once (rules not given are removed)",
		Long:  networkLong,
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			if !cmd.Flags().Changed("net") && !cmd.Flags().Changed("allow") {
				return fmt.Errorf("%w: give the whole new policy: --net public, --net deny, and/or --allow RULE (repeatable)", errdefs.ErrInvalid)
			}
			// The create flags' parser, for the same errors naming the flag.
			f := netFlags{mode: mode, allow: allow}
			if _, _, err := f.spec(g.lookupEnv); err != nil {
				return err
			}
			ctx, cancel := lifecycleCtx(cmd)
			defer cancel()
			st, err := c.SetNetwork(ctx, args[0], airlock.NetworkPolicy{Mode: mode, Allow: allow})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			fmt.Fprintln(cmd.OutOrStdout(), networkSetLine(args[0], st))
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&mode, "net", "", "egress mode: public (the public internet, plus --allow exceptions to the floor) or deny (only --allow); default deny with --allow, else public")
	fl.StringArrayVar(&allow, "allow", nil, "allow RULE: host, *.suffix, IP or CIDR, optionally :port or :lo-hi (repeatable; implies --net deny)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// networkSetLine says what a change did, in one line.
func networkSetLine(id string, st *airlock.NetworkState) string {
	n := st.Network
	var b strings.Builder
	fmt.Fprintf(&b, "%s: egress %s", id, n.Mode)
	if len(n.Allow) > 0 {
		fmt.Fprintf(&b, ", allow %s", strings.Join(n.Allow, " "))
	}
	switch st.Applied {
	case airlock.AppliedResume:
		b.WriteString("; the sandbox is paused: it applies when it resumes")
	default:
		fmt.Fprintf(&b, "; in force now, %d open connection%s closed", st.Closed, plural(st.Closed))
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// printNetwork prints a network as aligned lines.
func printNetwork(w io.Writer, n airlock.Network) {
	mode := n.Mode
	if mode == "" {
		mode = "public"
	}
	fmt.Fprintf(w, "mode:      %s\n", mode)
	if len(n.Allow) > 0 {
		fmt.Fprintf(w, "allow:     %s\n", strings.Join(n.Allow, "\n           "))
	}
	for _, s := range n.Secrets {
		fmt.Fprintf(w, "secret:    %s -> %s\n", s.Name, strings.Join(s.Hosts, ", "))
	}
	for _, p := range n.Ports {
		fmt.Fprintf(w, "port:      %s:%d -> %d\n", p.HostIP, p.HostPort, p.GuestPort)
	}
	if n.RateBytes > 0 {
		fmt.Fprintf(w, "rate:      %d bytes/s each way\n", n.RateBytes)
	}
	if n.MaxConns > 0 {
		fmt.Fprintf(w, "max conns: %d\n", n.MaxConns)
	}
}

func networkAddSecretCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add-secret ID NAME@host[,host][:Header] | vault:NAME[@host,...][:Header]",
		Short: "Add (or replace) a secret of a running or paused sandbox, at once",
		Long:  networkLong,
		Args:  cobra.ExactArgs(2),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			sec, err := parseSecretFlag(args[1])
			if err != nil {
				return err
			}
			s := airlock.Secret{Name: sec.Name, Hosts: sec.Hosts, Header: sec.Header, Vault: sec.Vault}
			if sec.Vault == "" {
				v, ok := g.lookupEnv(sec.Name)
				if !ok || v == "" {
					return fmt.Errorf("%w: $%s is unset or empty: airlock reads a secret's value from its own environment (export %s=...) or the vault (vault:%s), never from the command line",
						errdefs.ErrInvalid, sec.Name, sec.Name, sec.Name)
				}
				s.Value = v
			}
			ctx, cancel := lifecycleCtx(cmd)
			defer cancel()
			st, err := c.SetSandboxSecret(ctx, args[0], s)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			fmt.Fprintln(cmd.OutOrStdout(), secretChangeLine(args[0], "added "+sec.Name, st))
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func networkRmSecretCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "rm-secret ID NAME",
		Short: "Remove a secret from a running or paused sandbox, at once",
		Long:  networkLong,
		Args:  cobra.ExactArgs(2),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			ctx, cancel := lifecycleCtx(cmd)
			defer cancel()
			st, err := c.RemoveSandboxSecret(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			fmt.Fprintln(cmd.OutOrStdout(), secretChangeLine(args[0], "removed "+args[1], st))
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// secretChangeLine says what a live secret change did, in one line.
func secretChangeLine(id, what string, st *airlock.NetworkState) string {
	if st.Applied == airlock.AppliedResume {
		return fmt.Sprintf("%s: %s; the sandbox is paused: it applies when it resumes", id, what)
	}
	return fmt.Sprintf("%s: %s; in force now, %d open connection%s closed", id, what, st.Closed, plural(st.Closed))
}
