package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAllowHostMountConfig: allow_host_mount takes a list (or one value),
// relative to the file; the command line replaces the file's list.
func TestAllowHostMountConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "airlock.yaml")
	if err := os.WriteFile(p, []byte("version: 1\nallow_host_mount:\n  - /srv/a\n  - shared\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AIRLOCK_CONFIG", "")
	got, _, err := serveSettings(t, "--config", p)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[/srv/a," + filepath.Join(dir, "shared") + "]"; got["allow_host_mount"] != want {
		t.Errorf("from the file: %s, want %s", got["allow_host_mount"], want)
	}
	got, _, err = serveSettings(t, "--config", p, "--allow-host-mount", "/x", "--allow-host-mount", "/y")
	if err != nil || got["allow_host_mount"] != "[/x,/y]" {
		t.Errorf("flags over the file: %s %v", got["allow_host_mount"], err)
	}
	if err := os.WriteFile(p, []byte("version: 1\nallow_host_mount: /srv/one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _, err = serveSettings(t, "--config", p); err != nil || got["allow_host_mount"] != "[/srv/one]" {
		t.Errorf("one value: %s %v", got["allow_host_mount"], err)
	}
	for _, tc := range []struct{ text, want string }{
		{"version: 1\nallow_host_mount:\n  - [a]\n", "airlock.yaml:3: allow_host_mount: each item must be one plain value"},
		{"version: 1\nallow_host_mount:\n  -\n", "allow_host_mount: an item has no value"},
		{"version: 1\nallow_host_mount:\n  a: b\n", "must be one value or a list of values"},
		{"version: 1\nlisten:\n  - a\n", "listen must be one value, not a list"},
	} {
		if err := os.WriteFile(p, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := serveSettings(t, "--config", p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
}

func TestHostMountRoots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	state := filepath.Join(dir, "state")
	for _, d := range []string{real, state, filepath.Join(state, "sub")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := hostMountRoots([]string{real, real + "/", real}, state)
	if err != nil || len(got) != 1 || got[0] != real {
		t.Fatalf("roots: %v %v", got, err)
	}
	for _, tc := range []struct{ dir, want string }{
		{"rel/dir", "must be an absolute path"},
		{real + "/../real", "must be clean"},
		{"/", "would share the whole host"},
		{filepath.Join(dir, "link"), "symbolic link"},
		{filepath.Join(dir, "link", "x"), "symbolic link"},
		{filepath.Join(dir, "missing"), "no such directory"},
		{filepath.Join(dir, "file"), "not a directory"},
		{state, "state dir"},
		{filepath.Join(state, "sub"), "state dir"},
		{dir, "state dir"},
	} {
		if _, err := hostMountRoots([]string{tc.dir}, state); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--allow-host-mount") {
			t.Errorf("%s: %v, want %q", tc.dir, err, tc.want)
		}
	}
}
