package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFlagValueNames: cobra takes a back-quoted word in a flag's usage
// as the flag's value name in --help; no flag's value name may be more
// than one word (it once printed `--runtime airlock doctor` and `--image
// airlock image ls`).
func TestFlagValueNames(t *testing.T) {
	var walk func(*cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			n++
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " `") {
				t.Errorf("%s --%s: value name %q in --help", c.CommandPath(), f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd(&globals{}))
	if n < 50 {
		t.Fatalf("walked only %d flags", n)
	}
}

// TestCreateLifetimeFlag: the sandbox's lifetime is --lifetime on create
// as on run; --timeout, its old name on create, still sets it and warns.
func TestCreateLifetimeFlag(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	if r := runCLI(t, a, nil, "create", "--lifetime", "90s"); r.code != 0 || strings.Contains(r.stderr, "deprecated") {
		t.Fatalf("create --lifetime: %+v", r)
	}
	r := runCLI(t, a, nil, "create", "--timeout", "2m")
	if r.code != 0 || !strings.Contains(r.stderr+r.stdout, "use --lifetime") {
		t.Fatalf("create --timeout: %+v", r)
	}
	if creates := a.creates(); len(creates) != 2 || creates[0]["timeout_s"] != float64(90) || creates[1]["timeout_s"] != float64(120) {
		t.Fatalf("creates: %+v", creates)
	}
	if r := runCLI(t, a, nil, "create", "--help"); !strings.Contains(r.stdout, "--lifetime") || strings.Contains(r.stdout, "--timeout") {
		t.Fatalf("create --help shows --timeout or lacks --lifetime:\n%s", r.stdout)
	}
}

// TestEveryCommandHasExamples: every command a user sees in --help shows
// at least one example line that starts with "airlock" (or a shell line
// that runs it), and the JSON listings say so in their examples.
func TestEveryCommandHasExamples(t *testing.T) {
	n := 0
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		if c.HasParent() {
			n++
			if !strings.Contains(c.Example, "airlock ") {
				t.Errorf("%s: no example in --help", c.CommandPath())
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd(&globals{}))
	if n < 40 {
		t.Fatalf("walked only %d commands", n)
	}
	for _, c := range []string{"ls", "image ls", "keys ls", "snapshot ls", "contexts ls"} {
		if !strings.Contains(examples[c], "--json") && !strings.Contains(examples[strings.Fields(c)[0]], "--json") {
			t.Errorf("%s: the examples do not show --json", c)
		}
	}
}
