package statedir

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// PauseManifest is written next to a paused sandbox's saved state (and a
// snapshot's): what a resume needs beyond the catalog row, and the state's
// digest, checked on resume.
type PauseManifest struct {
	Version     int       `json:"version"`
	Kernel      string    `json:"kernel"`
	Initrd      string    `json:"initrd"`
	StateSHA256 string    `json:"state_sha256"`
	StateBytes  int64     `json:"state_bytes"`
	PausedAt    time.Time `json:"paused_at"`
	// For snapshots: the digest of the frozen disk overlay, the
	// snapshot's content address (over state and disk digests) and what it
	// was taken of. Empty for a paused sandbox, whose disk is its own.
	DiskSHA256  string `json:"disk_sha256,omitempty"`
	Digest      string `json:"digest,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	CPUs        int    `json:"cpus,omitempty"`
	MemoryMiB   int    `json:"memory_mib,omitempty"`
	DiskMiB     int    `json:"disk_mib,omitempty"`
	// Runtime and Accel are what saved the state (a restore needs the
	// same).
	Runtime string `json:"runtime,omitempty"`
	Accel   string `json:"accel,omitempty"`
	// RootInState says the state holds the sandbox's writes to its root
	// (gVisor: the writable layer lives in the sandbox's memory file): a
	// snapshot of it has no disk.
	RootInState bool `json:"root_in_state,omitempty"`
}

// Files of a pause (or snapshot) directory.
const (
	PauseStateDir     = "state"         // the runtime's saved state
	PauseManifestFile = "manifest.json" // PauseManifest
	// PausedExecsFile holds the execs a pause parked in the guest (the
	// shim's; a snapshot keeps a copy for its sandboxes).
	PausedExecsFile = "execs.json"
)

// HashDir is the sha256 over the regular files of dir (name, size,
// content, in name order) and their total size.
func HashDir(dir string) (string, int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	var total int64
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		n, err := HashFile(h, filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			return "", 0, err
		}
		total += n
	}
	return hex.EncodeToString(h.Sum(nil)), total, nil
}

// HashFile feeds name, path's content and its size into h (HashDir's
// record of one file; a snapshot's disk digest is one such record).
func HashFile(h io.Writer, path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fmt.Fprintf(h, "%s\x00", name)
	n, err := io.Copy(h, f)
	fmt.Fprintf(h, "\x00%d\x00", n)
	return n, err
}

// Snapshot files: snapshots/<id>/{state/, disk.qcow2, manifest.json}.
// The disk is the sandbox's overlay frozen at the moment of the snapshot;
// it is backed by the template's disk (and older snapshots' disks), which
// the catalog's disk references keep (template.Collect).
const SnapshotDisk = "disk.qcow2"

// DirUsage sums the allocated bytes of the files under dir.
func DirUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
