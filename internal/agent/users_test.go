package agent

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

func TestUserResolve(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	if err := os.WriteFile(passwd, []byte("# comment\n"+
		"root:x:0:0:root:/root:/bin/sh\n"+
		"broken line\n"+
		"alice:x:1234:100::/home/alice:/bin/sh\n"+
		"nohome:x:2000:2000::::\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(group, []byte("root:x:0:\nusers:x:100:\nstaff:x:50:bob, alice\ndocker:x:999:alice\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db := userDB{passwd: passwd, group: group}
	for _, tc := range []struct {
		spec string
		want identity
	}{
		{"", identity{uid: 0, gid: 0, groups: []uint32{0}, name: "root", home: "/root"}},
		{"root", identity{uid: 0, gid: 0, groups: []uint32{0}, name: "root", home: "/root"}},
		{"alice", identity{uid: 1234, gid: 100, groups: []uint32{100, 50, 999}, name: "alice", home: "/home/alice"}},
		{"1234", identity{uid: 1234, gid: 100, groups: []uint32{100, 50, 999}, name: "alice", home: "/home/alice"}},
		{"alice:staff", identity{uid: 1234, gid: 50, groups: []uint32{50, 999}, name: "alice", home: "/home/alice"}},
		{"alice:7", identity{uid: 1234, gid: 7, groups: []uint32{7, 50, 999}, name: "alice", home: "/home/alice"}},
		{"5000", identity{uid: 5000, gid: 5000, groups: []uint32{5000}, name: "5000", home: "/"}},
		{"5000:users", identity{uid: 5000, gid: 100, groups: []uint32{100}, name: "5000", home: "/"}},
		{"nohome", identity{uid: 2000, gid: 2000, groups: []uint32{2000}, name: "nohome", home: "/"}},
	} {
		got, err := db.resolve(tc.spec)
		if err != nil {
			t.Errorf("resolve(%q): %v", tc.spec, err)
			continue
		}
		if got.uid != tc.want.uid || got.gid != tc.want.gid || !slices.Equal(got.groups, tc.want.groups) || got.name != tc.want.name || got.home != tc.want.home {
			t.Errorf("resolve(%q) = %+v, want %+v", tc.spec, got, tc.want)
		}
	}
	for spec, code := range map[string]connect.Code{
		"mallory":       connect.CodeNotFound,
		"alice:nogroup": connect.CodeNotFound,
		"alice:":        connect.CodeInvalidArgument,
		":staff":        connect.CodeInvalidArgument,
		"4294967295":    connect.CodeNotFound, // (uid_t)-1 is not a uid; it is taken as a name
		"a\x00b":        connect.CodeInvalidArgument,
	} {
		if _, err := db.resolve(spec); connect.CodeOf(err) != code {
			t.Errorf("resolve(%q): %v, want %v", spec, err, code)
		}
	}

	// Missing files: only numeric users work, as root has no passwd entry.
	empty := userDB{passwd: filepath.Join(dir, "none"), group: filepath.Join(dir, "none")}
	if id, err := empty.resolve(""); err != nil || id.uid != 0 || id.home != "/root" {
		t.Errorf("resolve without passwd: %+v %v", id, err)
	}
	// A FIFO planted as /etc/passwd must not hang the agent.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (userDB{passwd: fifo, group: group}).resolve("alice"); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("resolve with a FIFO passwd: %v", err)
	}
}

func TestBuildEnv(t *testing.T) {
	t.Parallel()
	id := identity{name: "alice", home: "/home/alice"}
	got := buildEnv(id, []string{"PATH=/bin", "X=1", "X=2", "EMPTY="})
	want := []string{"PATH=/bin", "HOME=/home/alice", "USER=alice", "LOGNAME=alice", "LANG=C.UTF-8", "X=2", "EMPTY="}
	if !slices.Equal(got, want) {
		t.Errorf("buildEnv = %q, want %q", got, want)
	}
	if envValue(got, "PATH") != "/bin" || envValue(got, "NOPE") != "" {
		t.Error("envValue")
	}
}

func TestPathProblem(t *testing.T) {
	t.Parallel()
	for p, bad := range map[string]bool{
		"/": false, "/a": false, "/a/b.c": false, "/a/.hidden": false,
		"": true, "a": true, "/a/": true, "//a": true, "/a/./b": true, "/a/../b": true, "/..": true, "/a\x00": true,
	} {
		if got := pathProblem(p) != ""; got != bad {
			t.Errorf("pathProblem(%q) = %q", p, pathProblem(p))
		}
	}
}
