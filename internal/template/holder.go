package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// A template holder is a small long-lived process (`airlock template-holder`)
// that keeps one sealed, read-only memfd copy of a template's RAM. Shims open
// that memfd through /proc/<holder>/fd/<n> and hand it to QEMU, so every clone
// of a template, whichever shim started it, maps the same pages
// copy-on-write instead of each shim making its own copy. The holder takes an
// exclusive flock on holder.lock for its life (liveness without PIDs) and
// exits when its template is removed.

type holderInfo struct {
	PID int `json:"pid"`
	FD  int `json:"fd"`
}

// HolderIdle is how long a holder lives without a new clone. Clones keep
// their mappings when it exits; the next clone starts a new holder.
const HolderIdle = 10 * time.Minute

func holderLock(t Template) string { return filepath.Join(t.Dir, "holder.lock") }
func holderUsed(t Template) string { return filepath.Join(t.Dir, "holder.used") }
func holderFile(t Template) string { return filepath.Join(t.Dir, "holder.json") }

// RunHolder is the holder process's life: seal makes the memfd (the
// runtime's SealSnapshotRAM). It returns when the template is gone or ctx
// ends; if another holder is alive it returns nil at once.
func RunHolder(ctx context.Context, t Template, seal func(dir string) (*os.File, error), log *slog.Logger) error {
	lf, err := os.OpenFile(holderLock(t), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil // another holder serves this template
	}
	f, err := seal(t.Snapshot)
	if err != nil {
		return fmt.Errorf("seal template RAM: %w", err)
	}
	defer f.Close()
	b, _ := json.Marshal(holderInfo{PID: os.Getpid(), FD: int(f.Fd())})
	tmp := holderFile(t) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, holderFile(t)); err != nil {
		return err
	}
	log.Info("holding template RAM", "template", filepath.Base(t.Dir))
	touch(holderUsed(t))
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if _, err := os.Stat(filepath.Join(t.Dir, "meta.json")); err != nil {
				log.Info("template removed; holder exits", "template", filepath.Base(t.Dir))
				return nil
			}
			if fi, err := os.Stat(holderUsed(t)); err != nil || time.Since(fi.ModTime()) > HolderIdle {
				log.Info("template idle; holder exits", "template", filepath.Base(t.Dir))
				return nil
			}
		}
	}
}

// SharedRAM returns the template's RAM memfd from its holder, starting the
// holder (exe template-holder --state-dir root --template ID) if none is
// alive. The caller closes the file.
func SharedRAM(ctx context.Context, l statedir.Layout, t Template, exe string) (*os.File, error) {
	touch(holderUsed(t))
	if f, err := openHeld(t); err == nil {
		return f, nil
	}
	cmd := exec.Command(exe, "template-holder", "--state-dir", l.Root, "--template", filepath.Base(t.Dir))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start template holder: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reap it if it exits while we live
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := openHeld(t)
		if err == nil {
			return f, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("template holder: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// openHeld opens a live holder's memfd.
func openHeld(t Template) (*os.File, error) {
	lf, err := os.OpenFile(holderLock(t), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		_ = unix.Flock(int(lf.Fd()), unix.LOCK_UN)
		return nil, errors.New("no live holder")
	}
	b, err := os.ReadFile(holderFile(t))
	if err != nil {
		return nil, err
	}
	var h holderInfo
	if err := json.Unmarshal(b, &h); err != nil || h.PID <= 0 || h.FD < 0 {
		return nil, errors.New("bad holder.json")
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", h.PID))
	if err != nil || !strings.Contains(string(cmdline), "template-holder") {
		return nil, errors.New("holder process is gone")
	}
	// The runtime re-checks the seals and size before trusting it.
	return os.Open(fmt.Sprintf("/proc/%d/fd/%d", h.PID, h.FD))
}

// touch creates path or sets its mtime to now.
func touch(path string) {
	now := time.Now()
	if err := os.Chtimes(path, now, now); errors.Is(err, os.ErrNotExist) {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			f.Close()
		}
	}
}
