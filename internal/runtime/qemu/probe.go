package qemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// probeCache is StateDir/probe.json.
type probeCache struct {
	Key    string `json:"key"`
	Accel  string `json:"accel"`
	Reason string `json:"reason"`
}

const tcgSuffix = "; using TCG (slow)"

// probeKVM decides between KVM and TCG for Accel "auto". It never fails:
// anything that goes wrong means TCG, with the reason.
func (r *Runtime) probeKVM(ctx context.Context, version string) (accel, reason string) {
	f, err := os.OpenFile(r.kvmDevice, os.O_RDWR, 0)
	if err != nil {
		return "tcg", "no usable " + r.kvmDevice + tcgSuffix
	}
	f.Close()
	gid, err := kvmGroup(r.kvmDevice)
	if err != nil {
		return "tcg", err.Error() + tcgSuffix
	}
	if r.cfg.ProbeKernel == "" {
		return "tcg", "KVM not tested: no probe kernel configured" + tcgSuffix
	}
	key, err := probeKey(version, r.cfg.ProbeKernel, r.cfg.ProbeInitrd)
	if err != nil {
		return "tcg", "KVM not tested: probe kernel: " + err.Error() + tcgSuffix
	}
	path := filepath.Join(r.cfg.StateDir, "probe.json")
	if b, err := os.ReadFile(path); err == nil {
		var c probeCache
		if json.Unmarshal(b, &c) == nil && c.Key == key && (c.Accel == "kvm" || c.Accel == "tcg") {
			if c.Accel == "kvm" {
				r.kvmGID = gid
			}
			return c.Accel, c.Reason
		}
	}

	r.kvmGID = gid
	start := time.Now()
	err = r.bootProbe(ctx)
	if ctx.Err() != nil {
		// The caller gave up: say so, and do not cache a verdict.
		r.kvmGID = -1
		return "tcg", "KVM probe interrupted" + tcgSuffix
	}
	if err == nil {
		accel, reason = "kvm", fmt.Sprintf("KVM guest booted in %v", time.Since(start).Round(time.Millisecond))
	} else {
		r.kvmGID = -1
		accel, reason = "tcg", err.Error()+tcgSuffix
	}
	if b, err := json.Marshal(probeCache{Key: key, Accel: accel, Reason: reason}); err == nil {
		_ = runtime.WriteFileAtomic(path, b, 0o600)
	}
	return accel, reason
}

// probeError is a probe failure whose text is the one-line AccelReason.
type probeError string

func (e probeError) Error() string { return string(e) }

// bootProbeGuest boots ProbeKernel+ProbeInitrd under KVM, exactly as an
// instance runs (same uid, namespaces and sandbox), and waits for the
// agent's banner.
func (r *Runtime) bootProbeGuest(ctx context.Context) error {
	return r.bootProbeGuestWith(ctx, "kvm", r.cfg.ProbeTimeout)
}

// bootProbeGuestWith is bootProbeGuest with the accelerator and timeout as
// parameters (the vm tier runs the probe guest under TCG too).
func (r *Runtime) bootProbeGuestWith(ctx context.Context, accel string, timeout time.Duration) error {
	spec := runtime.Spec{
		ID:        "kvm-probe",
		CPUs:      1,
		MemoryMiB: 256,
		Kernel:    r.cfg.ProbeKernel,
		Initrd:    r.cfg.ProbeInitrd,
	}
	if err := os.MkdirAll(filepath.Join(r.cfg.StateDir, "run"), 0o700); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Join(r.cfg.StateDir, "run"), "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec.RunDir = dir
	in := r.newInstance(spec, accel, true)

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		return probeError("KVM guest failed to start: " + lastLine(err.Error()))
	}
	defer func() {
		_ = in.Kill()
		_, _ = in.Wait(context.WithoutCancel(ctx))
	}()
	conn, err := in.AgentConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	errc := make(chan error, 1)
	go func() { errc <- findBanner(conn) }()
	select {
	case err := <-errc:
		if err == nil {
			return nil
		}
	case <-ctx.Done():
	case <-in.done:
	}
	_ = conn.Close() // unblocks findBanner
	<-errc           //nolint:errcheck // findBanner's error is the close just done; staticcheck S1005 refuses "_ ="
	select {
	case <-in.done:
		st, _ := in.Wait(context.WithoutCancel(ctx))
		if st.Reason != "" {
			return probeError("KVM guest failed: " + st.Reason)
		}
	default:
	}
	return probeError(fmt.Sprintf("KVM guest did not boot within %v", timeout))
}

// lastLine returns the part of a start error worth a one-line reason: the
// VMM's last stderr line in parentheses if there is one.
func lastLine(s string) string {
	if i := strings.LastIndex(s, " ("); i >= 0 && strings.HasSuffix(s, ")") {
		return sanitize(s[i+2 : len(s)-1])
	}
	return sanitize(s)
}

// findBanner reads until the agent banner (or failure), within the same
// bound the host client uses.
func findBanner(r io.Reader) error {
	br := bufio.NewReader(io.LimitReader(r, agentapi.MaxPreBanner+int64(len(agentapi.Banner))))
	want := []byte(agentapi.Banner)
	var window []byte
	for {
		b, err := br.ReadByte()
		if err != nil {
			return err
		}
		window = append(window, b)
		if len(window) > len(want) {
			window = window[1:]
		}
		if bytes.Equal(window, want) {
			return nil
		}
	}
}

// kvmGroup says how an unprivileged VMM uid can open dev: -1 if everyone
// may, else the group that may (added to the VMM's groups). QEMU 7.2 opens
// /dev/kvm by path, so it cannot be passed as a descriptor.
func kvmGroup(dev string) (int, error) {
	fi, err := os.Stat(dev)
	if err != nil {
		return -1, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return -1, errors.New("stat " + dev)
	}
	mode := fi.Mode().Perm()
	switch {
	case mode&0o006 == 0o006:
		return -1, nil
	case mode&0o060 == 0o060 && st.Gid != 0:
		return int(st.Gid), nil
	default:
		return -1, fmt.Errorf("%s is not usable by unprivileged VMM uids (mode %04o, gid %d; give it a kvm group with rw)", dev, mode, st.Gid)
	}
}

// probeKey identifies what the verdict depends on: this boot of the host,
// the QEMU version and the probe kernel and initramfs.
func probeKey(version, kernel, initrd string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "boot=%s\nqemu=%s\n", hostBootID(), version)
	for _, p := range []string{kernel, initrd} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var ino uint64
		if st != nil {
			ino = st.Ino
		}
		fmt.Fprintf(h, "%s size=%d mtime=%d ino=%d\n", p, fi.Size(), fi.ModTime().UnixNano(), ino)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
