package sandbox

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestLogs: a tenant reads its sandbox's console (the end of it when it is
// longer than asked), never the supervisor's log, and nothing of another
// tenant's sandbox; an admin reads both; a missing log is not an error.
func TestLogs(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	id := "aaaaaaaaaaaa"
	if err := os.MkdirAll(m.L.RunDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	console := strings.Repeat("x", 100) + "the end\n"
	if err := os.WriteFile(m.L.Console(id), []byte(console), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.L.ShimLog(id), []byte("level=INFO msg=\"sandbox running\" path=/var/lib/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs, err := m.Logs(ctx, alice, id, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(logs) != 1 || logs[0].Source != LogConsole || !logs[0].Exists || logs[0].Size != int64(len(console)) || string(logs[0].Text) != "the end\n" {
		t.Fatalf("alice's logs: %+v", logs)
	}
	if _, err := m.Logs(ctx, bob, id, 0); !errors.Is(err, ErrNoSandbox) {
		t.Fatalf("bob reads alice's logs: %v", err)
	}
	logs, err = m.Logs(ctx, admin, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(logs) != 2 || string(logs[0].Text) != console || logs[1].Source != LogSupervisor || !strings.Contains(string(logs[1].Text), "sandbox running") {
		t.Fatalf("the admin's logs: %+v", logs)
	}
	logs, err = m.Logs(ctx, admin, "bbbbbbbbbbbb", 0)
	if err != nil || len(logs) != 2 || logs[0].Exists || logs[1].Exists {
		t.Fatalf("a sandbox without logs: %+v, %v", logs, err)
	}
}
