// Package security checks the adversarial suite's map
// (docs/THREATS-COVERAGE.md) against the code: the suite's tests are
// TestThreatNNN functions anywhere in the tree (`make test-security` runs
// them), and the map must name each under its own number, and only tests
// that exist.
package security

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	threatFunc = regexp.MustCompile(`(?m)^func (TestThreat(\d{3})\w*)\(t \*testing\.T\)`)
	threatName = regexp.MustCompile(`\bTestThreat(\d{3})\w*`)
	row        = regexp.MustCompile(`^\| (\d{3}) \| ([^|]+) \| (suite|tests|partial|n/a|open) \| (.*) \|$`)
)

func TestThreatMapMatchesTheCode(t *testing.T) {
	root := filepath.Join("..", "..")
	defined := map[string]string{} // test name -> threat number
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".cache" || d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range threatFunc.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = m[2]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 20 {
		t.Fatalf("only %d TestThreat functions found under %s: the walk is wrong", len(defined), root)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "THREATS-COVERAGE.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	named := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			if strings.HasPrefix(line, "| 0") || strings.HasPrefix(line, "| 1") {
				t.Errorf("malformed row: %s", line)
			}
			continue
		}
		num, status, tests := m[1], m[3], m[4]
		if rows[num] {
			t.Errorf("threat %s has two rows", num)
		}
		rows[num] = true
		suite := false
		for _, n := range threatName.FindAllString(tests, -1) {
			got, ok := defined[n]
			if !ok {
				t.Errorf("threat %s names %s, which no test file defines", num, n)
				continue
			}
			named[n] = true
			suite = suite || got == num
		}
		if status == "suite" && !suite {
			t.Errorf("threat %s is marked suite but names no TestThreat%s test", num, num)
		}
		if suite && status != "suite" {
			t.Errorf("threat %s has its own TestThreat test but is marked %s", num, status)
		}
	}
	if len(rows) != 128 {
		t.Errorf("%d threats in the map, want 128 (THREATS.md)", len(rows))
	}
	for n, num := range defined {
		if !named[n] {
			t.Errorf("%s (threat %s) is not in docs/THREATS-COVERAGE.md", n, num)
		}
	}
}
