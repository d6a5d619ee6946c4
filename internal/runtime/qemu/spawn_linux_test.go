package qemu

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// The helper process for TestParentDeathKillsVMM: it spawns a child with
// vmmSysProcAttr, the way own() spawns QEMU, prints its pid and blocks.
func init() {
	if os.Getenv("AIRLOCK_QEMU_SPAWN_HELPER") != "1" {
		return
	}
	uid, _ := strconv.Atoi(os.Getenv("AIRLOCK_QEMU_SPAWN_UID"))
	cmd := exec.Command("/bin/sleep", "1000")
	cmd.SysProcAttr = vmmSysProcAttr(uint32(uid), nil)
	if err := cmd.Start(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("pid", cmd.Process.Pid)
	_ = cmd.Wait()
	os.Exit(0)
}

// TestParentDeathKillsVMM checks that a VMM started with vmmSysProcAttr
// (after its uid change) dies when its parent is SIGKILLed: the
// orphaned-QEMU pitfall of notes §7.
func TestParentDeathKillsVMM(t *testing.T) {
	testutil.RequireRoot(t)
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), "AIRLOCK_QEMU_SPAWN_HELPER=1", "AIRLOCK_QEMU_SPAWN_UID=1900999999")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = helper.Process.Kill()
		t.Fatalf("helper: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "pid" {
		_ = helper.Process.Kill()
		t.Fatalf("helper said %q", line)
	}
	pid, _ := strconv.Atoi(f[1])
	st := procStatus(t, pid, "Uid", "NSpid")
	if !strings.HasPrefix(st["Uid"], "1900999999 ") || !strings.HasSuffix(st["NSpid"], " 1") {
		t.Errorf("child status %v", st)
	}

	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The child is reparented to init, which reaps it.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("child %d survived its parent's death", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
