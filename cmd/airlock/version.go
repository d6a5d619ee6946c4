package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

// versionLine is what `airlock version` prints: the build's version (git
// describe of the tree it was built from, `make build`), then the Go
// toolchain and platform.
func versionLine() string {
	return fmt.Sprintf("airlock %s (%s, %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print airlock's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return err
		},
	}
}
