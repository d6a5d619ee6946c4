package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// snapshotRoutes serves the snapshot and fork routes: one snapshot
// "after-setup" exists; forks of any sandbox get ids forkaaaaaaaN.
func (f *fakeAPI) snapshotRoutes(mux *http.ServeMux) {
	record := func(r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.snapReqs = append(f.snapReqs, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(b)))
		f.mu.Unlock()
	}
	snap := map[string]any{"name": "after-setup", "id": "0123abcd", "sandbox_id": "sbxaaaaaaaab", "image": "base", "cpus": 2,
		"memory_mb": 1024, "disk_mb": 2048, "size_bytes": 96 << 20, "created_at": time.Now().UTC()}
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshot", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSONResp(w, 201, snap)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSONResp(w, 201, map[string]any{"sandboxes": []map[string]any{
			{"id": "forkaaaaaaa2", "state": "running", "source": "fork:" + r.PathValue("id")},
			{"id": "forkaaaaaaa3", "state": "running", "source": "fork:" + r.PathValue("id")},
		}})
	})
	mux.HandleFunc("GET /v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSONResp(w, 200, map[string]any{"snapshots": []any{snap}})
	})
	mux.HandleFunc("DELETE /v1/snapshots/{name}", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		if r.PathValue("name") != "after-setup" {
			apiError(w, 404, "not_found", "snapshot not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/snapshots/prune", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		writeJSONResp(w, 200, map[string]any{"freed_bytes": 5 << 20})
	})
}

func TestRemoteSnapshotFork(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	if got := runCLI(t, srv, nil, "snapshot", "sbxaaaaaaaab", "--name", "after-setup").stdout; got != "after-setup 0123abcd 96.0M\n" {
		t.Errorf("snapshot printed %q", got)
	}
	if got := runCLI(t, srv, nil, "snapshot", "create", "sbxaaaaaaaab", "--name", "after-setup", "--force").stdout; got != "after-setup 0123abcd 96.0M\n" {
		t.Errorf("snapshot create printed %q", got)
	}
	res := runCLI(t, srv, nil, "snapshot", "ls")
	if !strings.Contains(res.stdout, "NAME") || !strings.Contains(res.stdout, "after-setup") || !strings.Contains(res.stdout, "sbxaaaaaaaab") || !strings.Contains(res.stdout, "96.0M") {
		t.Errorf("snapshot ls: %q", res.stdout)
	}
	if res := runCLI(t, srv, nil, "snapshot", "ls", "--json"); !strings.Contains(res.stdout, `"size_bytes": 100663296`) {
		t.Errorf("snapshot ls --json: %q", res.stdout)
	}
	if res := runCLI(t, srv, nil, "snapshot", "rm", "after-setup", "nope"); res.stdout != "after-setup\n" || !strings.Contains(res.stderr, "snapshot rm nope") || res.code != 1 {
		t.Errorf("snapshot rm: %+v", res)
	}
	if res := runCLI(t, srv, nil, "snapshot", "prune"); res.stdout != "freed 5.0M (5242880 bytes)\n" {
		t.Errorf("snapshot prune: %+v", res)
	}
	if res := runCLI(t, srv, nil, "fork", "sbxaaaaaaaab", "--count", "2"); res.stdout != "forkaaaaaaa2\nforkaaaaaaa3\n" {
		t.Errorf("fork: %+v", res)
	}
	for _, args := range [][]string{{"snapshot", "sbxaaaaaaaab"}, {"snapshot", "sbxaaaaaaaab", "--name", "_fork-x"}, {"snapshot", "sbxaaaaaaaab", "--name", "a b"}} {
		if res := runCLI(t, srv, nil, args...); res.code == 0 {
			t.Errorf("%v: accepted", args)
		}
	}
	f.mu.Lock()
	reqs := strings.Join(f.snapReqs, "\n")
	f.mu.Unlock()
	want := strings.Join([]string{
		`POST /v1/sandboxes/sbxaaaaaaaab/snapshot {"name":"after-setup","force":false}`,
		`POST /v1/sandboxes/sbxaaaaaaaab/snapshot {"name":"after-setup","force":true}`,
		"GET /v1/snapshots ", "GET /v1/snapshots ",
		"DELETE /v1/snapshots/after-setup ", "DELETE /v1/snapshots/nope ",
		"POST /v1/snapshots/prune ",
		`POST /v1/sandboxes/sbxaaaaaaaab/fork {"count":2,"force":false}`,
	}, "\n")
	if reqs != want {
		t.Errorf("requests:\n%s\nwant:\n%s", reqs, want)
	}
}

func TestRemoteCreateFromSnapshot(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	if res := runCLI(t, srv, nil, "create", "--from-snapshot", "after-setup", "--lifetime", "1m"); res.code != 0 {
		t.Fatalf("create: %+v", res)
	}
	in := f.creates[0]
	if in["from_snapshot"] != "after-setup" || in["cpus"] != nil || in["memory_mb"] != nil || in["image"] != nil || in["timeout_s"] != float64(60) {
		t.Errorf("create request %v", in)
	}
	if res := runCLI(t, srv, nil, "create", "--from-snapshot", "after-setup", "--net", "none"); res.code == 0 || !strings.Contains(res.stderr, "--net") {
		t.Errorf("create --from-snapshot --net: %+v", res)
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0K", 1536: "1.5K", 5 << 20: "5.0M", 3 << 30: "3.0G"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
