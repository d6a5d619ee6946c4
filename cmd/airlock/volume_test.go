package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func TestParseVolumeFlag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]sandbox.VolumeMount{
		"data:/data":       {Name: "data", Path: "/data"},
		"data:/data:rw":    {Name: "data", Path: "/data"},
		"data:/mnt/d:ro":   {Name: "data", Path: "/mnt/d", ReadOnly: true},
		"my.vol-1:/srv/x":  {Name: "my.vol-1", Path: "/srv/x"},
		"my_vol:/srv/x:ro": {Name: "my_vol", Path: "/srv/x", ReadOnly: true},
	} {
		if got, err := parseVolumeFlag(in); err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"data":             "want NAME:/path",
		"data:":            "want NAME:/path",
		":/data":           "want NAME:/path",
		"data:/data:rx":    "want NAME:/path",
		"data:/a:/b":       "want NAME:/path",
		"Data:/data":       "volume name",
		"data:rel":         "must be absolute",
		"data:/":           "replace the guest's root",
		"data:/proc/x":     "/proc",
		"data:/a/../b":     "not clean",
		"data:/data/:ro":   "not clean",
		"da ta:/data:ro":   "volume name",
		"data:/data:ro:ro": "want NAME:/path",
	} {
		_, err := parseVolumeFlag(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--volume") {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestParseMountFlag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]sandbox.HostMount{
		"/srv/src:/src":       {HostPath: "/srv/src", Path: "/src"},
		"/srv/src:/src:ro":    {HostPath: "/srv/src", Path: "/src"},
		"/srv/src:/src:rw":    {HostPath: "/srv/src", Path: "/src", ReadWrite: true},
		"./src:/src":          {HostPath: "./src", Path: "/src"},
		"/a:b/c:/c":           {HostPath: "/a:b/c", Path: "/c"}, // the guest path has no ':'
		"relative/dir:/x:rw":  {HostPath: "relative/dir", Path: "/x", ReadWrite: true},
		"/host:/guest/deeper": {HostPath: "/host", Path: "/guest/deeper"},
	} {
		if got, err := parseMountFlag(in); err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"/srv/src":       "want HOST:GUEST",
		":/src":          "want HOST:GUEST",
		"/srv/src:":      "want HOST:GUEST",
		"/srv/src:rel":   "must be absolute",
		"/srv/src:/":     "replace the guest's root",
		"/srv/src:/dev":  "/dev",
		"/srv:/a/./b:ro": "not clean",
	} {
		_, err := parseMountFlag(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--mount") {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestHostMountPaths(t *testing.T) {
	t.Parallel()
	cwd := func() (string, error) { return "/home/u/proj", nil }
	o := sandbox.CreateOptions{HostMounts: []sandbox.HostMount{{HostPath: "./src", Path: "/src"}, {HostPath: "out/../data", Path: "/d"}, {HostPath: "/abs//x/", Path: "/x"}}}
	if err := hostMountPaths(&o, false, cwd); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(o.HostMounts); got != fmt.Sprint([]sandbox.HostMount{{HostPath: "/home/u/proj/src", Path: "/src"}, {HostPath: "/home/u/proj/data", Path: "/d"}, {HostPath: "/abs/x", Path: "/x"}}) {
		t.Fatalf("local: %s", got)
	}
	o = sandbox.CreateOptions{HostMounts: []sandbox.HostMount{{HostPath: "/abs", Path: "/a"}, {HostPath: "src", Path: "/src"}}}
	if err := hostMountPaths(&o, true, cwd); err == nil || !strings.Contains(err.Error(), "must be absolute with AIRLOCK_HOST set") {
		t.Fatalf("remote relative: %v", err)
	}
	if err := hostMountPaths(&o, false, func() (string, error) { return "", errors.New("no cwd") }); err == nil || !strings.Contains(err.Error(), "no cwd") {
		t.Fatalf("cwd error: %v", err)
	}
}

// TestVolumeCommands: volume create, ls, inspect, resize and rm through
// the API, and -v on create as it reaches the server.
func TestVolumeCommands(t *testing.T) {
	a := newTestAPI(t)
	if r := runCLI(t, a, nil, "volume", "create", "data", "--size", "32M"); r.code != 0 || r.stdout != "data\n" {
		t.Fatalf("create: %+v", r)
	}
	for _, args := range [][]string{
		{"volume", "create", "data2"},
		{"volume", "create", "data2", "--size", "8M"},
		{"volume", "create", "Bad", "--size", "1G"},
		{"volume", "resize", "data", "--size", "lots"},
	} {
		if r := runCLI(t, a, nil, args...); r.code == 0 || !strings.Contains(r.stderr, "airlock:") {
			t.Errorf("%v: %+v", args, r)
		}
	}
	if n := len(a.requests("POST", "/v1/volumes")); n != 1 {
		t.Fatalf("%d create requests: bad flags must be refused before any request", n)
	}
	if r := runCLI(t, a, nil, "volume", "create", "data", "--size", "32M"); r.code == 0 || !strings.Contains(r.stderr, "already has a volume") {
		t.Fatalf("duplicate: %+v", r)
	}
	if r := runCLI(t, a, nil, "volume", "resize", "data", "--size", "64M"); r.code != 0 || r.stdout != "data 64.0M\n" {
		t.Fatalf("resize: %+v", r)
	}
	r := runCLI(t, a, nil, "create", "-v", "data:/data", "--volume", "data2x:/x:ro")
	if r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("create with a missing volume: %+v", r)
	}
	r = runCLI(t, a, nil, "create", "-v", "data:/data")
	if r.code != 0 {
		t.Fatalf("create -v: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	creates := a.creates()
	if got := fmt.Sprint(creates[len(creates)-1]["volumes"]); got != "[map[name:data path:/data]]" {
		t.Fatalf("create body volumes: %s", got)
	}
	r = runCLI(t, a, nil, "volume", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "data") || !strings.Contains(r.stdout, id+":/data:rw") {
		t.Fatalf("ls: %+v", r)
	}
	r = runCLI(t, a, nil, "volume", "inspect", "data", "--json")
	var v airlock.Volume
	if err := json.Unmarshal([]byte(r.stdout), &v); r.code != 0 || err != nil || v.SizeMB != 64 || len(v.Attachments) != 1 || v.Attachments[0].SandboxID != id {
		t.Fatalf("inspect: %+v %v", r, err)
	}
	r = runCLI(t, a, nil, "volume", "inspect", "data")
	if r.code != 0 || !strings.Contains(r.stdout, "mounted by: "+id+" at /data, read-write") {
		t.Fatalf("inspect: %+v", r)
	}
	r = runCLI(t, a, nil, "inspect", id)
	if r.code != 0 || !strings.Contains(r.stdout, `"volume": "data"`) {
		t.Fatalf("sandbox inspect: %+v", r)
	}
	// One writer: a second read-write or read-only mount is refused.
	for _, spec := range []string{"data:/data", "data:/data:ro"} {
		if r := runCLI(t, a, nil, "create", "-v", spec); r.code == 0 || !strings.Contains(r.stderr, "mounted elsewhere") {
			t.Errorf("second mount %s: %+v", spec, r)
		}
	}
	if r := runCLI(t, a, nil, "volume", "rm", "data"); r.code == 0 || !strings.Contains(r.stderr, "mounted by a sandbox") {
		t.Fatalf("rm while attached: %+v", r)
	}
	if r := runCLI(t, a, nil, "rm", id); r.code != 0 {
		t.Fatalf("rm sandbox: %+v", r)
	}
	if r := runCLI(t, a, nil, "volume", "rm", "data", "nothing"); r.code != 1 || r.stdout != "data\n" || !strings.Contains(r.stderr, "volume rm nothing: ") {
		t.Fatalf("rm: %+v", r)
	}
	if r := runCLI(t, a, nil, "volume", "ls", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("ls after rm: %+v", r)
	}
	// Through AIRLOCK_HOST a relative host path is refused before any
	// request.
	n := len(a.creates())
	if r := runCLI(t, a, nil, "create", "--mount", "./src:/src"); r.code == 0 || !strings.Contains(r.stderr, "must be absolute with AIRLOCK_HOST set") {
		t.Fatalf("remote relative mount: %+v", r)
	}
	if r := runCLI(t, a, nil, "run", "--mount", "/srv:/srv:xx", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "--mount") {
		t.Fatalf("bad mount flag: %+v", r)
	}
	if len(a.creates()) != n {
		t.Fatal("a refused --mount reached the server")
	}
	// An API key mounts host directories only under the server's
	// --allow-host-mount roots; the answer names neither path nor roots.
	root := t.TempDir()
	r = runCLI(t, a, nil, "create", "--mount", root+":/src")
	if r.code == 0 || !strings.Contains(r.stderr, "only under the directories the server's admin allows") || strings.Contains(r.stderr, root) {
		t.Fatalf("host mount without roots: %+v", r)
	}
	a.m.HostMountRoots = []string{root}
	if r = runCLI(t, a, nil, "create", "--mount", root+":/src"); r.code != 0 {
		t.Fatalf("host mount under a root: %+v", r)
	}
}

// TestVolumeCommandsLocal: without AIRLOCK_HOST the CLI is the local user:
// its volumes, and any host directory (a relative one taken from the
// current directory); the manager's full text reaches it.
func TestVolumeCommandsLocal(t *testing.T) {
	a := newTestAPI(t)
	if r := runLocal(t, a, nil, "volume", "create", "local", "--size", "16M"); r.code != 0 || r.stdout != "local\n" {
		t.Fatalf("create: %+v", r)
	}
	if r := runLocal(t, a, nil, "volume", "ls", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"name": "local"`) {
		t.Fatalf("ls: %+v", r)
	}
	// The local user's volumes are not an API key's.
	if r := runCLI(t, a, nil, "volume", "inspect", "local"); r.code == 0 || !strings.Contains(r.stderr, "volume not found") {
		t.Fatalf("the key's tenant sees the local volume: %+v", r)
	}
	// A read-write host mount on a host mount that is not nosuid is
	// refused, in the manager's words.
	if r := runLocal(t, a, nil, "create", "--mount", t.TempDir()+":/src:rw"); r.code == 0 || !strings.Contains(r.stderr, "nosuid") {
		t.Fatalf("read-write host mount on a suid mount: %+v", r)
	}
	// A relative host path is taken from the current directory.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if r := runLocal(t, a, nil, "create", "--mount", "no-such-dir:/src"); r.code == 0 || !strings.Contains(r.stderr, filepath.Join(wd, "no-such-dir")) || !strings.Contains(r.stderr, "no such directory") {
		t.Fatalf("relative host path: %+v", r)
	}
	if r := runLocal(t, a, nil, "volume", "rm", "local"); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
}
