package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/envknob"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestMain doubles as a stand-in for `airlock shim` when startShim runs
// this test binary (Manager.Exe): it reads its configuration document the
// way the real shim does and reports what it was given.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		os.Exit(standInShim())
	}
	os.Exit(m.Run())
}

// shimReport is what the stand-in shim saw.
type shimReport struct {
	Argv []string
	Env  []string
	Doc  shimconf.Doc
}

func standInShim() int {
	ready := os.NewFile(3, "ready")
	doc, err := shimconf.Read(os.NewFile(shimconf.FD, "config"))
	if err != nil {
		fmt.Fprintf(ready, "error: %s\n", err)
		return 1
	}
	b, _ := json.Marshal(shimReport{Argv: os.Args, Env: os.Environ(), Doc: doc})
	if err := os.WriteFile(filepath.Join(doc.StateDir, "report.json"), b, 0o600); err != nil {
		fmt.Fprintf(ready, "error: %s\n", err)
		return 1
	}
	fmt.Fprintln(ready, "ok")
	return 0
}

// TestStartShimHandsOverOneDocument: the manager gives a shim every
// setting, the secret values included, in its configuration document on a
// pipe; argv names only the sandbox, and neither argv nor the environment
// holds a secret value or an environment knob.
func TestStartShimHandsOverOneDocument(t *testing.T) {
	const value = "sk-REAL-VALUE-0123456789"
	t.Setenv("API_KEY", value) // the caller's own copy (`--secret API_KEY@host`)
	t.Setenv(envknob.TestDialMap.Name, "192.0.2.9=127.0.0.1")
	l := statedir.Layout{Root: t.TempDir()}
	id := statedir.NewID()
	if err := os.MkdirAll(l.Dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	opts := shimconf.Options{Accel: "tcg", HostCgroups: "off", DNS: "127.0.0.1:5353", TestDialMap: "192.0.2.1=127.0.0.1"}
	m := &Manager{L: l, Exe: os.Args[0], Shim: opts, DiskReserve: 4 << 30}
	lock, err := m.takeShimLock(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.startShim(t.Context(), store.Sandbox{ID: id, Runtime: "gvisor"}, netconf.Values{"API_KEY": value}, "", lock); err != nil {
		t.Fatalf("start: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(l.Root, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r shimReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	want := shimconf.Doc{Version: shimconf.Version, StateDir: l.Root, ID: id, Runtime: "gvisor", DiskReserve: 4 << 30,
		Options: opts.WithDefaults(), Secrets: netconf.Values{"API_KEY": value}}
	if !reflect.DeepEqual(r.Doc, want) || r.Doc.LogLevel != "info" {
		t.Errorf("document %+v, want %+v", r.Doc, want)
	}
	if !slices.Equal(r.Argv[1:], []string{"shim", "--id", id}) {
		t.Errorf("argv %q, want shim --id %s", r.Argv, id)
	}
	for _, kv := range r.Env {
		if strings.Contains(kv, value) || strings.HasPrefix(kv, envknob.TestDialMap.Name+"=") {
			t.Errorf("the shim's environment holds %q", kv)
		}
	}
	if !slices.ContainsFunc(r.Env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		t.Error("the shim lost the rest of its environment (PATH)")
	}
}

// TestStartShimRefusesABadDocument: the manager checks the document
// (shimconf.Doc.Validate) before it starts a shim with it.
func TestStartShimRefusesABadDocument(t *testing.T) {
	t.Parallel()
	l := statedir.Layout{Root: t.TempDir()}
	id := statedir.NewID()
	if err := os.MkdirAll(l.Dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	m := &Manager{L: l, Exe: os.Args[0], Shim: shimconf.Options{Accel: "hvf"}}
	lock, err := m.takeShimLock(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.startShim(t.Context(), store.Sandbox{ID: id}, nil, "", lock); err == nil || !strings.Contains(err.Error(), `accel "hvf"`) {
		t.Fatalf("start with a bad accel: %v", err)
	}
	if _, err := os.Stat(filepath.Join(l.Root, "report.json")); err == nil {
		t.Fatal("a shim started with a refused document")
	}
}
