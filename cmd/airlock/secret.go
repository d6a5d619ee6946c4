package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

const secretLong = `Keep secrets in the vault: host-side values that sandboxes reference by name.

` + "`secret set NAME`" + ` stores a value, read from standard input (--stdin) or from $NAME in
airlock's own environment, never from the command line. It is sealed at rest with the
host's key (AES-256-GCM, bound to the tenant and the name) and never printed, logged or
audited. --hosts limits the hosts any sandbox may send it to (a sandbox may name fewer).
A sandbox takes it with ` + "`create --secret vault:NAME[@host,...]`" + ` or, while it runs,
` + "`network add-secret ID vault:NAME`" + `: the guest sees a placeholder in $NAME, and the
value is put into requests to the secret's hosts on the host side. Each API key's tenant
has a vault of its own (at most 256 secrets of at most 16 KiB each). Setting and removing
are audited as secret.set and secret.rm, by name. A sandbox that was given a value keeps
it when the vault secret is replaced or removed.`

func secretCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Store, list and remove host-side secrets (the vault) that sandboxes reference by name",
		Long:  secretLong,
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(secretSetCmd(g), secretLsCmd(g), secretRmCmd(g))
	return cmd
}

func secretSetCmd(g *globals) *cobra.Command {
	var (
		hosts    []string
		useStdin bool
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "set NAME [--hosts h1,h2] [--stdin]",
		Short: "Store a secret in the vault (value from stdin or $NAME, never argv)",
		Long:  secretLong,
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			name := args[0]
			if !netconf.ValidEnvName(name) {
				if n, _, ok := strings.Cut(name, "="); ok && netconf.ValidEnvName(n) {
					return fmt.Errorf("%w: give the name only: the value is read from standard input (--stdin) or $%s, never from the command line", errdefs.ErrInvalid, n)
				}
				return fmt.Errorf("%w: secret name %q must be letters, digits and _, not starting with a digit", errdefs.ErrInvalid, name)
			}
			value, err := secretValue(cmd.InOrStdin(), useStdin, name, g.lookupEnv)
			if err != nil {
				return err
			}
			v, err := c.SetVaultSecret(cmd.Context(), name, value, hosts...)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.Name)
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&hosts, "hosts", nil, "the only hosts (names or *.suffix) a sandbox may send it to, comma-separated (default: whichever the sandbox names)")
	fl.BoolVar(&useStdin, "stdin", false, "read the value from standard input (one trailing newline is dropped) instead of $NAME")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// secretValue reads a vault secret's value: standard input with useStdin,
// else $name in airlock's environment.
func secretValue(stdin io.Reader, useStdin bool, name string, lookup func(string) (string, bool)) (string, error) {
	if !useStdin {
		v, ok := lookup(name)
		if !ok || v == "" {
			return "", fmt.Errorf("%w: $%s is unset or empty: give the value in airlock's environment (export %s=...) or on standard input with --stdin, never on the command line", errdefs.ErrInvalid, name, name)
		}
		return v, nil
	}
	b, err := io.ReadAll(io.LimitReader(stdin, netconf.MaxSecretLen+2))
	if err != nil {
		return "", fmt.Errorf("read the value from standard input: %w", err)
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) == 0 {
		return "", fmt.Errorf("%w: standard input was empty: the secret needs a value", errdefs.ErrInvalid)
	}
	if len(b) > netconf.MaxSecretLen {
		return "", fmt.Errorf("%w: the value is over %d bytes", errdefs.ErrInvalid, netconf.MaxSecretLen)
	}
	return string(b), nil
}

func secretLsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the vault's secrets: names, hosts and times (never values)",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			list, err := c.ListVaultSecrets(cmd.Context())
			if err != nil {
				return err
			}
			if list == nil {
				list = []airlock.VaultSecret{}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOSTS\tUPDATED")
			for _, v := range list {
				h := strings.Join(v.Hosts, ",")
				if h == "" {
					h = "(any the sandbox names)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, h, v.UpdatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func secretRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove secrets from the vault (sandboxes given their values keep them)",
		Args:  cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			for _, name := range args {
				if err := c.DeleteVaultSecret(cmd.Context(), name); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
			}
			return nil
		}),
	}
}
