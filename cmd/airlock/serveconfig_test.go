package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// TestServeConfigParse: a good file gives each key's value and line; every
// kind of bad file is refused with its line and the key at fault.
func TestServeConfigParse(t *testing.T) {
	t.Parallel()
	good := `# comment
version: 1
listen: "127.0.0.1:7443"
tls:
  cert: tls/cert.pem
  key: /etc/airlock/key.pem
preview_domain: sbx.example.com
drain: 45s
log:
  level: debug
  access: false
state_dir: /var/lib/airlock
runtime: gvisor
accel: tcg
host_cgroups: "off"
disk_reserve: 4G
allow_host_mount: [/srv/shared]
template_registry: [ghcr.io]
`
	vals, err := parseServeConfig("a.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range vals {
		got[v.key.key] = v.value
		if v.key.key == "tls.key" && v.line != 6 {
			t.Errorf("tls.key on line %d, want 6", v.line)
		}
	}
	want := map[string]string{"listen": "127.0.0.1:7443", "tls.cert": "tls/cert.pem", "tls.key": "/etc/airlock/key.pem",
		"preview_domain": "sbx.example.com", "drain": "45s", "log.level": "debug", "log.access": "false",
		"state_dir": "/var/lib/airlock", "runtime": "gvisor", "accel": "tcg", "host_cgroups": "off", "disk_reserve": "4G",
		"allow_host_mount": "/srv/shared", "template_registry": "ghcr.io"}
	if len(got) != len(want) {
		t.Errorf("got %d keys, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(want) != len(configKeys) {
		t.Errorf("the test covers %d keys of %d", len(want), len(configKeys))
	}

	// Empty sections (their keys commented out) are fine.
	if _, err := parseServeConfig("a.yaml", []byte("version: 1\ntls:\n#  cert: x\nlog:\n")); err != nil {
		t.Errorf("empty sections: %v", err)
	}

	for _, tc := range []struct{ name, text, want string }{
		{"unknown key", "version: 1\nlisten: x:1\nlisen: y:2\n", `a.yaml:3: unknown key "lisen"`},
		{"unknown nested key", "version: 1\ntls:\n  cert: c\n  certificate: d\n", `a.yaml:4: unknown key "tls.certificate"`},
		{"quota keys do not exist", "version: 1\nmax_sandboxes: 3\n", `a.yaml:2: unknown key "max_sandboxes"`},
		{"twice", "version: 1\ndrain: 1s\ndrain: 2s\n", "a.yaml:3: drain is set twice (first on line 2)"},
		{"no version", "listen: x:1\n", `a.yaml:1: no "version: 1"`},
		{"other version", "version: 2\n", `a.yaml:1: version "2"`},
		{"empty file", "", "a.yaml is empty"},
		{"not a mapping", "- listen\n", "a.yaml:1: the file must be a mapping"},
		{"list value", "version: 1\nlisten: [a, b]\n", "a.yaml:2: listen must be one value"},
		{"section value", "version: 1\nlisten:\n  host: x\n", "a.yaml:3: listen must be one value"},
		{"null value", "version: 1\npreview_domain:\n", "a.yaml:2: preview_domain has no value"},
		{"scalar section", "version: 1\ntls: yes\n", "a.yaml:2: tls must be a section of keys (cert, key)"},
		{"alias", "version: 1\nlisten: &a x:1\ndrain: *a\n", "anchors and aliases are not allowed"},
		{"tag", "version: 1\ndrain: !!str 5s\n", "a.yaml:2: drain: tags"},
		{"two documents", "version: 1\n---\nversion: 1\n", "a second YAML document"},
		{"bad yaml", "version: 1\nlisten: [\n", "a.yaml: yaml:"},
		{"key not a name", "version: 1\n[a]: b\n", "a.yaml:2: a key must be a plain name"},
	} {
		_, err := parseServeConfig("a.yaml", []byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want an ErrInvalid with %q", tc.name, err, tc.want)
		}
	}
}

// TestServeConfigFile: the file is refused when other users may write
// it, when it is not a regular file (a FIFO would block the open) or too
// large.
func TestServeConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "airlock.yaml")
	if err := os.WriteFile(p, []byte("version: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readServeConfig(p); err != nil {
		t.Fatalf("a good file: %v", err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := readServeConfig(p); err == nil || !strings.Contains(err.Error(), "written by every user") {
		t.Errorf("world-writable: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("version: 1\n#"+strings.Repeat("x", maxConfigBytes)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readServeConfig(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("too large: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := readServeConfig(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("fifo: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reading a FIFO as the config blocked")
	}
	if _, err := readServeConfig(filepath.Join(dir, "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// serveSettings runs serve's flag, environment and config handling (its
// PreRunE) over args and returns the settings RunE would get.
func serveSettings(t *testing.T, args ...string) (map[string]string, *globals, error) {
	t.Helper()
	g := &globals{}
	root := rootCmd(g)
	serve, _, err := root.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	serve.RunE = func(cmd *cobra.Command, _ []string) error {
		for _, k := range configKeys {
			got[k.key] = cmd.Flag(k.flag).Value.String()
		}
		return nil
	}
	root.SetArgs(append([]string{"serve"}, args...))
	return got, g, root.ExecuteContext(context.Background())
}

// TestServeConfigPrecedence: flags, then environment variables, then the
// file, then defaults; relative paths in the file are relative to it; a
// value the flag refuses names the key and its line; TLS needs both files.
// Not parallel: it sets environment variables.
func TestServeConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "airlock.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`version: 1
listen: 127.0.0.1:7001
drain: 10s
preview_domain: file.example.com
state_dir: state
tls:
  cert: cert.pem
  key: /abs/key.pem
log:
  level: error
  access: false
accel: tcg
disk_reserve: 8G
`)
	for _, k := range []string{"AIRLOCK_LISTEN", "AIRLOCK_PREVIEW_DOMAIN", "AIRLOCK_STATE_DIR", "AIRLOCK_ACCEL", "AIRLOCK_RUNTIME", "AIRLOCK_HOST_CGROUPS", "AIRLOCK_DISK_RESERVE", "AIRLOCK_CONFIG"} {
		t.Setenv(k, "")
	}
	t.Setenv("AIRLOCK_PREVIEW_DOMAIN", "env.example.com")
	t.Setenv("AIRLOCK_ACCEL", "kvm")
	t.Setenv("AIRLOCK_DISK_RESERVE", "1G")
	got, g, err := serveSettings(t, "--config", p, "--drain", "5s")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"listen":         "127.0.0.1:7001",            // file
		"drain":          "5s",                        // flag over file
		"preview_domain": "env.example.com",           // env over file
		"accel":          "kvm",                       // env over file
		"disk_reserve":   "1G",                        // env over file
		"state_dir":      filepath.Join(dir, "state"), // relative to the file
		"tls.cert":       filepath.Join(dir, "cert.pem"),
		"tls.key":        "/abs/key.pem",
		"log.level":      "error",
		"log.access":     "false",
		"runtime":        "auto", // default
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if g.log.Enabled(context.Background(), slog.LevelWarn) {
		t.Error("log.level error in the file did not reach the logger")
	}

	// AIRLOCK_CONFIG names the file; without log.level a server logs at
	// info.
	write("version: 1\nlisten: 127.0.0.1:7002\n")
	t.Setenv("AIRLOCK_CONFIG", p)
	got, g, err = serveSettings(t)
	if err != nil {
		t.Fatal(err)
	}
	if got["listen"] != "127.0.0.1:7002" || got["log.level"] != "info" || got["log.access"] != "true" {
		t.Errorf("AIRLOCK_CONFIG: %v", got)
	}
	if !g.log.Enabled(context.Background(), slog.LevelInfo) {
		t.Error("serve does not log at info by default")
	}
	t.Setenv("AIRLOCK_CONFIG", "")

	for _, tc := range []struct{ text, want string }{
		{"version: 1\ndrain: soon\n", `airlock.yaml:2: drain: time: invalid duration "soon"`},
		{"version: 1\nlog:\n  access: yes\n", "airlock.yaml:3: log.access:"},
		{"version: 1\ndisk_reserve: lots\n", "airlock.yaml:2: disk_reserve:"},
		{"version: 1\nlisten: nowhere\n", `listen "nowhere"`},
		{"version: 1\ntls:\n  cert: c.pem\n", "TLS needs both a certificate and its key"},
		{"version: 1\nlog:\n  level: loud\n", `airlock.yaml:3: log.level: slog: level string "loud"`},
		{"version: 1\nruntime: docker\n", `airlock.yaml:2: runtime: "docker" is not one of qemu, gvisor, auto`},
		{"version: 1\naccel: fast\n", "airlock.yaml:2: accel:"},
		{"version: 1\nhost_cgroups: maybe\n", "airlock.yaml:2: host_cgroups:"},
		{"version: 1\ndrain: -1s\n", "drain -1s: must be between"},
	} {
		write(tc.text)
		if _, _, err := serveSettings(t, "--config", p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
	if _, _, err := serveSettings(t, "--tls-key", "k.pem"); err == nil || !strings.Contains(err.Error(), "TLS needs both") {
		t.Errorf("--tls-key alone: %v", err)
	}
}
