// Package testutil holds the gates for airlock's test tiers and small shared
// test helpers.
//
// Tiers (see docs/TESTING.md):
//   - unit: Go only; always on; `go test -short ./...` runs only these.
//   - host: needs root; opt-in with AIRLOCK_TEST_ROOT=1.
//   - vm: boots real guests with QEMU; opt-in with AIRLOCK_TEST_VM=1 and not
//     under -short. AIRLOCK_TEST_ACCEL=kvm|tcg|auto picks the accelerator.
//   - kube: a real kube-apiserver and etcd on loopback (package kubetest);
//     opt-in with AIRLOCK_TEST_KUBE_BIN, which make test-kube sets.
//
// A gate skips with one actionable message when its tier was not requested,
// and fails the test when it was requested but the host cannot provide it.
package testutil

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireRoot skips t unless AIRLOCK_TEST_ROOT=1, and fails it if the tier
// was requested but the test does not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("AIRLOCK_TEST_ROOT") != "1" {
		t.Skip("host tier: set AIRLOCK_TEST_ROOT=1 and run as root (make test-host)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("AIRLOCK_TEST_ROOT=1 but the test is not running as root")
	}
}

// RequireVM skips t under -short or unless AIRLOCK_TEST_VM=1, and fails it if
// the tier was requested but QEMU is missing.
func RequireVM(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("vm tier: not under -short")
	}
	if os.Getenv("AIRLOCK_TEST_VM") != "1" {
		t.Skip("vm tier: set AIRLOCK_TEST_VM=1 (make test-vm) to boot real guests")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("AIRLOCK_TEST_VM=1 but qemu-system-x86_64 is not installed (run: make deps)")
	}
}

// Accel returns the accelerator the vm tier asked for: "kvm", "tcg" or
// "auto" (the default).
func Accel() string {
	switch a := os.Getenv("AIRLOCK_TEST_ACCEL"); a {
	case "kvm", "tcg":
		return a
	default:
		return "auto"
	}
}

// StateDir returns the state dir the vm tier shares between tests
// (AIRLOCK_TEST_STATE_DIR), so the guest kernel, images and templates are
// built once. It fails the test if the variable is unset.
func StateDir(t testing.TB) string {
	t.Helper()
	d := os.Getenv("AIRLOCK_TEST_STATE_DIR")
	if d == "" {
		t.Fatal("vm tier needs AIRLOCK_TEST_STATE_DIR (a state dir prepared by `airlock setup`; make test-vm sets it)")
	}
	return d
}

// BootFiles returns the guest kernel and agent initramfs for vm-tier tests:
// AIRLOCK_TEST_KERNEL and AIRLOCK_TEST_INITRD if set, else the ones `airlock
// setup` recorded in the state dir's boot.json. It fails the test if neither
// is available.
func BootFiles(t testing.TB) (kernel, initrd string) {
	t.Helper()
	kernel, initrd = os.Getenv("AIRLOCK_TEST_KERNEL"), os.Getenv("AIRLOCK_TEST_INITRD")
	if kernel != "" && initrd != "" {
		return kernel, initrd
	}
	b, err := os.ReadFile(filepath.Join(StateDir(t), "boot.json"))
	if err != nil {
		t.Fatalf("vm tier needs AIRLOCK_TEST_KERNEL/AIRLOCK_TEST_INITRD or a state dir prepared by `airlock setup`: %v", err)
	}
	var bc struct{ Kernel, Initrd string }
	if err := json.Unmarshal(b, &bc); err != nil || bc.Kernel == "" || bc.Initrd == "" {
		t.Fatalf("bad boot.json in the test state dir: %v", err)
	}
	return bc.Kernel, bc.Initrd
}

// NeedRoot skips t when not running as root, but fails it when the host
// tier was requested (AIRLOCK_TEST_ROOT=1): a test that can run anywhere
// as root must not vanish from the tier that promised root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("AIRLOCK_TEST_ROOT") == "1" {
		t.Fatal("AIRLOCK_TEST_ROOT=1 but the test is not running as root")
	}
	t.Skip("needs root (the host tier, AIRLOCK_TEST_ROOT=1, fails instead of skipping)")
}

// NeedTool skips t when the program name is not on PATH, but fails it when
// the host or vm tier was requested (AIRLOCK_TEST_ROOT=1 or
// AIRLOCK_TEST_VM=1: `make test`, which installs every tool with `make
// deps` first). hint says how to install it.
func NeedTool(t testing.TB, name, hint string) {
	t.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	if os.Getenv("AIRLOCK_TEST_ROOT") == "1" || os.Getenv("AIRLOCK_TEST_VM") == "1" {
		t.Fatalf("%s is not installed (%s); the requested test tiers need it", name, hint)
	}
	t.Skipf("%s not installed (%s); set AIRLOCK_TEST_ROOT=1 or AIRLOCK_TEST_VM=1 to make this fail", name, hint)
}
