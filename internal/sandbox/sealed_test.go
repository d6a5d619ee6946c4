package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// TestSealedSecrets: a sandbox's sealed values open for it and only for
// it, hold no plaintext, and a damaged file or key is refused with a
// reason rather than opened wrong.
func TestSealedSecrets(t *testing.T) {
	t.Parallel()
	m := &Manager{L: statedir.Layout{Root: t.TempDir()}}
	for _, id := range []string{"aaaaaaaaaaaa", "bbbbbbbbbbbb"} {
		if err := os.MkdirAll(m.L.Dir(id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	vals := netconf.Values{"API_KEY": "sk-sealed-5f4e3d2c1b0a", "TOKEN": "t0k3n-value-99"}
	if err := m.sealSecrets("aaaaaaaaaaaa", vals); err != nil {
		t.Fatal(err)
	}
	got, err := m.openSecrets("aaaaaaaaaaaa")
	if err != nil || len(got) != 2 || got["API_KEY"] != vals["API_KEY"] || got["TOKEN"] != vals["TOKEN"] {
		t.Fatalf("opened %v, %v", got, err)
	}
	sealedPath := filepath.Join(m.L.Dir("aaaaaaaaaaaa"), sealedSecretsFile)
	sealed, err := os.ReadFile(sealedPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vals {
		if bytes.Contains(sealed, []byte(v)) {
			t.Errorf("the sealed file holds %q in plaintext", v)
		}
	}
	for _, p := range []string{sealedPath, filepath.Join(m.L.Root, secretsKeyFile)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want mode 0600", p, fi.Mode(), err)
		}
	}
	// Copied to another sandbox, it does not open.
	if err := os.WriteFile(filepath.Join(m.L.Dir("bbbbbbbbbbbb"), sealedSecretsFile), sealed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.openSecrets("bbbbbbbbbbbb"); err == nil || !strings.Contains(err.Error(), "do not open") {
		t.Errorf("another sandbox's sealed values: %v", err)
	}
	// One flipped bit, and it does not open.
	bad := bytes.Clone(sealed)
	bad[len(bad)-1] ^= 1
	if err := os.WriteFile(sealedPath, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.openSecrets("aaaaaaaaaaaa"); err == nil {
		t.Error("a tampered file opened")
	}
	if err := os.Remove(sealedPath); err != nil {
		t.Fatal(err)
	}
	if _, err := m.openSecrets("aaaaaaaaaaaa"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("no sealed file: %v", err)
	}
	// A second seal uses the same key; a damaged key is refused.
	if err := m.sealSecrets("aaaaaaaaaaaa", vals); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.L.Root, secretsKeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.openSecrets("aaaaaaaaaaaa"); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("a damaged key: %v", err)
	}
}
