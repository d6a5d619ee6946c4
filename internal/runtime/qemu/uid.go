package qemu

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// uidLease is one uid from the range, held by an flock on
// StateDir/run/uids/<uid>.lock until Release. The lock dies with the
// process that holds it, so a crashed shim frees its uid (its QEMU dies
// with it through the parent-death signal).
type uidLease struct {
	UID  uint32
	lock *os.File
}

// Release frees the uid. Call it only after the QEMU that ran as this uid
// has exited (its pid namespace is then empty). Idempotent.
func (l *uidLease) Release() error {
	if l == nil || l.lock == nil {
		return nil
	}
	// Unlocking by closing: the file stays for the next holder, so that
	// two processes never flock different inodes for one uid.
	err := l.lock.Close()
	l.lock = nil
	return err
}

// acquireUID takes a free uid from [base, base+count) by trying flocks,
// starting at a random offset so that concurrent shims rarely collide.
func acquireUID(stateDir string, base, count uint32) (*uidLease, error) {
	dir := filepath.Join(stateDir, "run", "uids")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("uid locks: %w", err)
	}
	start := rand.Uint32N(count)
	for i := range count {
		uid := base + (start+i)%count
		f, err := os.OpenFile(filepath.Join(dir, strconv.FormatUint(uint64(uid), 10)+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("uid lock: %w", err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return &uidLease{UID: uid, lock: f}, nil
		}
		f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("uid lock: %w", err)
		}
	}
	return nil, fmt.Errorf("%w: all %d VMM uids are in use", errdefs.ErrResourceExhausted, count)
}
