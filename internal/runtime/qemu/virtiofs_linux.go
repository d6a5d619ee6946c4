package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Host directories (Spec.Mounts with Dir) reach a qemu guest over
// virtio-fs: one virtiofsd per directory (QEMU 7.2's, from Debian's
// qemu-system-common), serving a mount point of the instance's own that
// runtime.BindHostDir made from a descriptor opened without following
// symlinks (nosuid, nodev, read-only for a read-only mount). virtiofsd
// pivots into that directory in its own mount, pid and network
// namespaces, so the guest's paths and symlinks resolve inside it. Its
// vhost-user socket never appears to QEMU by path: virtiofsd gets the
// listening socket as --fd, this process connects, and QEMU gets the
// connected end as a descriptor.
//
// vhost-user-fs cannot migrate: a VM with a host directory cannot be
// paused, snapshotted or forked, and is never a template or a clone.

// virtiofsdPaths are where Debian puts virtiofsd (QEMU 7.2's C daemon;
// later Debian releases ship the Rust one in its own package).
var virtiofsdPaths = []string{"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"}

func findVirtiofsd() (string, error) {
	for _, p := range virtiofsdPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("virtiofsd is not installed (Debian: qemu-system-common); host mounts on qemu need it")
}

// startVirtiofsd serves host directory m.Dir for Spec.Mounts[i] and
// returns QEMU's end of its vhost-user connection.
func (l *launch) startVirtiofsd(runDir string, i int, m runtime.Mount) (*os.File, error) {
	bin, err := findVirtiofsd()
	if err != nil {
		return nil, err
	}
	l.mountsDir = filepath.Join(runDir, "mounts")
	if err := os.Mkdir(l.mountsDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	point := filepath.Join(l.mountsDir, strconv.Itoa(i))
	if err := os.Mkdir(point, 0o700); err != nil {
		return nil, err
	}
	if err := runtime.BindHostDir(m.Dir, point, m.ReadOnly); err != nil {
		return nil, err
	}
	sock := filepath.Join(runDir, "virtiofs"+strconv.Itoa(i)+".sock")
	_ = os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("virtiofs socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("virtiofs socket: %w", err)
	}
	defer lnFile.Close()
	logf, err := os.OpenFile(filepath.Join(runDir, "virtiofsd"+strconv.Itoa(i)+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--fd=3", "-o", "source="+point, "-o", "cache=auto", "-o", "sandbox=namespace",
		"-o", "log_level=warn", "--thread-pool-size=4")
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lnFile}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start virtiofsd: %w", err)
	}
	l.fsds = append(l.fsds, cmd)
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	_ = os.Remove(sock)
	if err != nil {
		return nil, fmt.Errorf("connect to virtiofsd: %w", err)
	}
	defer conn.Close()
	f, err := conn.File()
	if err != nil {
		return nil, err
	}
	return f, nil
}
