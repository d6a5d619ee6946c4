package gvisor

import (
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
)

// A sandbox's agent runs from a host file that runsc binds into it, and a
// checkpoint does not hold the pages of that file it never read: a restore
// reads them again from the file at the same path. Had the file changed
// meanwhile (airlock upgraded or rebuilt), the restored agent would run a
// mix of two binaries (measured: "fatal: morestack on gsignal", the agent
// gone before it spoke). So sandboxes bind a content-addressed copy of the
// agent (Config.AgentDir), each saved state names the one it ran
// (AgentStateFile), and a restore binds that one or refuses.

// AgentStateFile, in a state directory SaveState writes, holds the sha256
// of the agent binary the sandbox ran (a bundle that moves the state
// carries it).
const AgentStateFile = "agent.sha256"

// agentFile is the name of the copy of the agent binary with digest sum
// in Config.AgentDir.
func agentFile(sum string) string { return "sha256-" + sum }

// agentFileSum is the digest an agentFile name (or path) carries.
func agentFileSum(name string) (string, bool) {
	s, ok := strings.CutPrefix(filepath.Base(name), "sha256-")
	return s, ok && validSum(s)
}

// stateAgent is the digest of the agent a saved state in dir ran; ""
// if the state names none (saved before airlock recorded it).
func stateAgent(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, AgentStateFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	if s := strings.TrimSpace(string(b)); validSum(s) {
		return s, nil
	}
	return "", errors.New("the saved state names no valid agent digest")
}

// validSum reports whether s is a lowercase hex sha256.
func validSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// stageAgent returns the digest of the agent binary src and the path
// sandboxes bind: src itself without dir, else dir's copy of it (made on
// first use, read-only). The digest of a src already copied is found by
// its file identity (device, inode, size, modification and change times)
// in dir/by-stat, so a start does not hash the binary again.
func stageAgent(dir, src string) (sum, path string, err error) {
	fi, err := os.Stat(src)
	if err != nil {
		return "", "", fmt.Errorf("gvisor: agent: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", "", fmt.Errorf("gvisor: agent %s is not a regular file", src)
	}
	if dir == "" {
		sum, err := hashFile(src, nil)
		return sum, src, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", "", errors.New("gvisor: agent: no file identity")
	}
	byStat := filepath.Join(dir, "by-stat")
	key := filepath.Join(byStat, fmt.Sprintf("%d.%d.%d.%d.%d", st.Dev, st.Ino, fi.Size(), fi.ModTime().UnixNano(), st.Ctim.Nano()))
	if t, err := os.Readlink(key); err == nil {
		if s, ok := agentFileSum(t); ok {
			p := filepath.Join(dir, agentFile(s))
			if pi, err := os.Stat(p); err == nil && pi.Mode().IsRegular() && pi.Size() == fi.Size() {
				return s, p, nil
			}
		}
	}
	if err := os.MkdirAll(byStat, 0o700); err != nil {
		return "", "", fmt.Errorf("gvisor: agent copies: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return "", "", fmt.Errorf("gvisor: agent copies: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone once renamed
	sum, err = hashFile(src, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o555)
	}
	if err != nil {
		return "", "", fmt.Errorf("gvisor: copy the agent: %w", err)
	}
	path = filepath.Join(dir, agentFile(sum))
	if _, err := os.Stat(path); err != nil {
		// Another start may rename the same bytes here too: either wins.
		if err := os.Rename(tmp.Name(), path); err != nil {
			return "", "", fmt.Errorf("gvisor: copy the agent: %w", err)
		}
	}
	link := key + ".tmp-" + filepath.Base(tmp.Name())
	if err := os.Symlink(filepath.Join("..", agentFile(sum)), link); err == nil {
		if err := os.Rename(link, key); err != nil {
			_ = os.Remove(link)
		}
	}
	return sum, path, nil
}

// hashFile returns the sha256 of the file at path, copying it to w if w
// is not nil.
func hashFile(path string, w io.Writer) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	dst := io.Writer(h)
	if w != nil {
		dst = io.MultiWriter(h, w)
	}
	if _, err := io.Copy(dst, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// agentFor returns the agent binary the instance binds and its digest:
// the runtime's, or for a restore the one its state was saved with
// (Config.AgentDir keeps it). A state saved before airlock recorded its
// agent restores with the runtime's.
func (in *instance) agentFor() (path, sum string, err error) {
	r := in.rt
	own, ownSum, err := r.ownAgent()
	if err != nil || in.spec.RestoreFrom == "" {
		return own, ownSum, err
	}
	sum, err = stateAgent(in.spec.RestoreFrom)
	if err != nil {
		return "", "", fmt.Errorf("gvisor restore: %w", err)
	}
	if sum == "" || sum == ownSum {
		return own, ownSum, nil
	}
	if r.cfg.AgentDir != "" {
		p := filepath.Join(r.cfg.AgentDir, agentFile(sum))
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, sum, nil
		}
	}
	return "", "", fmt.Errorf("gvisor restore: the state was saved with guest agent sha256:%.12s, which this host does not have (its own is sha256:%.12s); restore it with the airlock that saved it", sum, ownSum)
}

// AgentsInUse returns the digests of the agent binaries that sandboxes may
// bind again: those the saved states in stateDirs name (pauses,
// snapshots) and those the runsc bundles under runDirs bind (running
// sandboxes, which a pause or a snapshot may save).
func AgentsInUse(stateDirs, runDirs []string) map[string]bool {
	use := map[string]bool{}
	for _, d := range stateDirs {
		if s, err := stateAgent(d); err == nil && s != "" {
			use[s] = true
		}
	}
	for _, d := range runDirs {
		b, err := os.ReadFile(filepath.Join(d, "bundle", "config.json"))
		if err != nil {
			continue
		}
		var spec struct {
			Mounts []struct{ Destination, Source string }
		}
		if json.Unmarshal(b, &spec) != nil {
			continue
		}
		for _, m := range spec.Mounts {
			if s, ok := agentFileSum(m.Source); ok && m.Destination == AgentPath {
				use[s] = true
			}
		}
	}
	return use
}

// PruneAgents removes the copies in dir (Config.AgentDir) whose digest is
// not in use and that were made more than grace ago (a start may be
// staging one), and the by-stat links left pointing nowhere. It returns
// the bytes freed.
func PruneAgents(dir string, use map[string]bool, grace time.Duration) (int64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	var freed int64
	var errs []error
	for _, e := range ents {
		s, ok := agentFileSum(e.Name())
		if !ok || use[s] {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < grace {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		freed += fi.Size()
	}
	links, _ := filepath.Glob(filepath.Join(dir, "by-stat", "*"))
	for _, l := range links {
		if _, err := os.Stat(l); errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(l)
		}
	}
	return freed, errors.Join(errs...)
}
