package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

func TestFileRename(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	from, to := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(from, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	rename := func(from, to string) error {
		_, err := env.c.Files.Rename(t.Context(), connect.NewRequest(&agentv1.RenameRequest{From: from, To: to}))
		return err
	}
	if err := rename(from, to); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(to); err != nil || string(b) != "x" {
		t.Fatalf("renamed file: %q %v", b, err)
	}
	if err := rename(from, to); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("rename of a missing file: %v", err)
	}
	for _, bad := range [][2]string{{"rel", to}, {to, dir + "/../x"}, {"/", to}} {
		if err := rename(bad[0], bad[1]); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("rename %q -> %q: %v", bad[0], bad[1], err)
		}
	}
}

// TestFileWatch: a recursive watch reports creates, writes, removes and
// renames by path relative to the watched directory, in directories made
// after it started too.
func TestFileWatch(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "old"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := env.c.Files.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || !st.Msg().GetStarted() {
		t.Fatalf("first message: %v %v", st.Msg(), st.Err())
	}
	events := make(chan string, 100)
	go func() {
		for st.Receive() {
			e := st.Msg().GetEvent()
			events <- e.GetOp().String() + " " + e.GetName()
		}
		close(events)
	}()
	want := func(ev string) {
		t.Helper()
		for {
			select {
			case got, ok := <-events:
				if !ok {
					t.Fatalf("stream ended before %q: %v", ev, st.Err())
				}
				if got == ev {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no %q", ev)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "top.txt"), []byte("1"), 0o644))
	want("FILE_OP_CREATE top.txt")
	want("FILE_OP_WRITE top.txt")
	must(os.WriteFile(filepath.Join(dir, "old", "in.txt"), []byte("1"), 0o644))
	want("FILE_OP_CREATE old/in.txt")
	must(os.Mkdir(filepath.Join(dir, "new"), 0o755))
	want("FILE_OP_CREATE new")
	must(os.WriteFile(filepath.Join(dir, "new", "later.txt"), []byte("1"), 0o644))
	want("FILE_OP_CREATE new/later.txt")
	// A tree made at once (before a watch on its new directories could be
	// in place) is reported whole.
	must(os.MkdirAll(filepath.Join(dir, "deep", "er"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "deep", "er", "f.txt"), []byte("1"), 0o644))
	want("FILE_OP_CREATE deep")
	want("FILE_OP_CREATE deep/er/f.txt")
	must(os.Rename(filepath.Join(dir, "top.txt"), filepath.Join(dir, "moved.txt")))
	want("FILE_OP_RENAME top.txt")
	want("FILE_OP_CREATE moved.txt")
	must(os.Remove(filepath.Join(dir, "moved.txt")))
	want("FILE_OP_REMOVE moved.txt")

	// A file is not a directory to watch; a missing path is not found.
	for p, code := range map[string]connect.Code{filepath.Join(dir, "old", "in.txt"): connect.CodeFailedPrecondition, filepath.Join(dir, "none"): connect.CodeNotFound} {
		w, err := env.c.Files.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{Path: p}))
		if err == nil {
			for w.Receive() {
			}
			err = w.Err()
		}
		if connect.CodeOf(err) != code {
			t.Errorf("watch %s: %v, want %v", strings.TrimPrefix(p, dir), err, code)
		}
	}
}
