package qemu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Ethernet types the guest may send once its NIC is up.
const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
)

// guestNet is the config every Sync in these tests enables.
var guestNet = &agentv1.NetworkConfig{
	Enabled: true, Address: "10.0.2.15/24", Gateway: "10.0.2.2",
	Nameservers: []string{"10.0.2.3"}, Mtu: 1500,
}

// TestVMNetwork boots a template with a NIC, lets the agent bring the NIC
// up and sees the guest's frames on NetConn; then takes the NIC down,
// snapshots, and checks that a restored clone's fresh
// link carries frames once its own Sync brings the NIC up.
func TestVMNetwork(t *testing.T) {
	f := newVMFixture(t)
	dir := world(t)
	tmplDisk := filepath.Join(dir, "tmpl.qcow2")
	overlay(t, tmplDisk, baseDisk(t, dir), "raw")
	spec := f.spec(t, tmplDisk)
	spec.Snapshottable, spec.Network = true, true
	tmpl, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	logConsoleOnFailure(t, spec.RunDir)
	if _, err := tmpl.(runtime.Networker).NetConn(t.Context()); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("NetConn before Start: %v", err)
	}
	if err := tmpl.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tmpl.Kill() }()
	nc := netConn(t, tmpl)
	if _, err := tmpl.(runtime.Networker).NetConn(t.Context()); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second NetConn: %v", err)
	}
	ac := f.dialAgent(t, tmpl)
	syncNet(t, f, ac, guestNet)
	t.Logf("template: %s", readFrame(t, f, nc))
	// Again: idempotent.
	syncNet(t, f, ac, guestNet)
	syncNet(t, f, ac, &agentv1.NetworkConfig{Enabled: false})
	ac.Close()

	snap := filepath.Join(dir, "snap")
	if err := os.Mkdir(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := tmpl.(runtime.Snapshotter).SaveSnapshot(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	// The template's link ends with its VMM.
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, nc); err != nil {
		t.Errorf("template link after exit: %v", err)
	}
	nc.Close()
	if err := os.Chmod(tmplDisk, 0o444); err != nil {
		t.Fatal(err)
	}

	// A clone must have the template's NIC.
	cs := f.spec(t, filepath.Join(t.TempDir(), "clone.qcow2"))
	cs.ID, cs.RestoreFrom = "net-clone", snap
	overlay(t, cs.RootDisk, tmplDisk, "qcow2")
	if _, err := f.rt.Create(t.Context(), cs); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("restore without Network: %v", err)
	}
	cs.Network = true
	clone, err := f.rt.Create(t.Context(), cs)
	if err != nil {
		t.Fatal(err)
	}
	logConsoleOnFailure(t, cs.RunDir)
	if err := clone.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = clone.Kill() }()
	cnc := netConn(t, clone)
	defer cnc.Close()
	cac := f.dialAgent(t, clone)
	defer cac.Close()
	syncNet(t, f, cac, guestNet)
	t.Logf("clone: %s", readFrame(t, f, cnc))
}

// logConsoleOnFailure logs the guest console if the test fails.
func logConsoleOnFailure(t *testing.T, runDir string) {
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(runDir, "console.log"))
			t.Logf("console.log of %s:\n%s", runDir, b)
		}
	})
}

func netConn(t *testing.T, in runtime.Instance) net.Conn {
	t.Helper()
	nc, err := in.(runtime.Networker).NetConn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

func (f *vmFixture) dialAgent(t *testing.T, in runtime.Instance) *agentapi.Client {
	t.Helper()
	conn, err := in.AgentConn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second*f.scale)
	defer cancel()
	ac, err := agentapi.Dial(ctx, conn, agentapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return ac
}

func syncNet(t *testing.T, f *vmFixture, ac *agentapi.Client, n *agentv1.NetworkConfig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second*f.scale)
	defer cancel()
	if _, err := ac.SyncWith(ctx, agentapi.SyncOptions{Network: n}); err != nil {
		t.Fatalf("sync %v: %v", n, err)
	}
}

// readFrame reads stream-netdev frames from nc until one is ARP or IPv4
// (other frames, such as QEMU's RARP announcements after a restore, are
// only checked for their framing) and describes it.
func readFrame(t *testing.T, f *vmFixture, nc net.Conn) string {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second * f.scale))
	defer func() { _ = nc.SetReadDeadline(time.Time{}) }()
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			t.Fatalf("read frame length: %v", err)
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 14 || n > 65535+14 {
			t.Fatalf("frame length %d", n)
		}
		frame := make([]byte, n)
		if _, err := io.ReadFull(nc, frame); err != nil {
			t.Fatalf("read frame: %v", err)
		}
		et := binary.BigEndian.Uint16(frame[12:14])
		desc := fmt.Sprintf("len=%d dst=%x src=%x type=%#04x", n, frame[0:6], frame[6:12], et)
		if net.HardwareAddr(frame[6:12]).String() != GuestMAC {
			t.Errorf("frame from another MAC: %s", desc)
		}
		switch et {
		case etherTypeARP:
			if n < 14+28 {
				t.Fatalf("short ARP: %s", desc)
			}
			return desc + fmt.Sprintf(" arp op=%d sender=%v target=%v", binary.BigEndian.Uint16(frame[20:22]), net.IP(frame[28:32]), net.IP(frame[38:42]))
		case etherTypeIPv4:
			return desc
		}
		t.Logf("skipped frame: %s", desc)
	}
}
