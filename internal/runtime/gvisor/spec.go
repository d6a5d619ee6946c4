package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// AgentPath is where the agent binary is bind-mounted (read-only) in every
// sandbox; the image does not need to contain it.
const AgentPath = "/.airlock-agent"

// MountPoints are the paths the OCI spec mounts over. They must exist in an
// image tree before sandboxes use it (PrepareRoot): runsc's gofer would
// otherwise create the missing ones in the shared tree itself.
var MountPoints = []MountPoint{
	{"/proc", true}, {"/sys", true}, {"/dev", true}, {"/dev/pts", true}, {"/dev/shm", true},
	{"/tmp", true}, {"/run", true}, {AgentPath, false},
	{StagePath(0), true}, {StagePath(1), true}, {StagePath(2), true}, {StagePath(3), true},
}

// StagePath is where Spec.Mounts[i] is mounted in the sandbox before the
// agent moves it to its target: runsc's gofer needs every mount point to
// exist in the image tree, which is shared and read-only, so the targets
// users choose cannot be mount points of the spec.
func StagePath(i int) string { return "/.airlock-mounts/" + strconv.Itoa(i) }

// MountPoint is a path the sandbox's spec mounts over.
type MountPoint struct {
	Path string
	Dir  bool // a directory; else an empty file (a file bind mount)
}

// PrepareRoot creates MountPoints in the image tree root (as root, before
// the tree is shared). Idempotent: on a tree that has them all it writes
// nothing (so it succeeds on a read-only one).
func PrepareRoot(root string) error {
	for _, m := range MountPoints {
		p := filepath.Join(root, m.Path)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if m.Dir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return fmt.Errorf("prepare root: %w", err)
			}
			continue
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o444)
		if err != nil {
			return fmt.Errorf("prepare root: %w", err)
		}
		f.Close()
	}
	return nil
}

// agentArg is internal/agent.ContainerArg (not imported: host packages do
// not link the agent).
const agentArg = "-container"

// The subset of the OCI runtime spec (v1.0) that airlock writes. Field names
// and JSON keys follow github.com/opencontainers/runtime-spec/specs-go.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname,omitempty"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociProcess struct {
	User         ociUser         `json:"user"`
	Args         []string        `json:"args"`
	Env          []string        `json:"env"`
	Cwd          string          `json:"cwd"`
	Capabilities ociCapabilities `json:"capabilities"`
	Rlimits      []ociRlimit     `json:"rlimits,omitempty"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	Resources   *ociResources  `json:"resources,omitempty"`
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
}

type ociNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
}

type ociCPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

// allCaps is every capability gVisor knows. The guest's root has them all,
// as in a VM: the sandbox boundary is gVisor's kernel, not capabilities.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
}

// bundleSpec is what buildSpec needs besides the runtime.Spec.
type bundleSpec struct {
	agent       string     // host path of the agent binary
	netnsPath   string     // "" without Spec.Network
	cgroupsPath string     // "" to apply no resource limits
	mounts      []ociMount // Spec.Mounts as prepared (prepareMounts)
}

// buildSpec returns the OCI config.json for spec: the agent as init, the
// image directory (spec.RootDisk) as a writable root whose writes go to
// runsc's per-sandbox overlay (readonly must be false for runsc to apply
// --overlay2), and CPU and memory limits when b.cgroupsPath is set.
func buildSpec(spec runtime.Spec, b bundleSpec) ([]byte, error) {
	caps := ociCapabilities{Bounding: allCaps, Effective: allCaps, Permitted: allCaps}
	tmpfs := func(dst, opts string) ociMount {
		return ociMount{Destination: dst, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", opts}}
	}
	s := ociSpec{
		Version: "1.0.2",
		Process: ociProcess{
			Args:         []string{AgentPath, agentArg},
			Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:          "/",
			Capabilities: caps,
			Rlimits:      []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 524288, Soft: 65536}},
		},
		Root:     ociRoot{Path: spec.RootDisk, Readonly: false},
		Hostname: "airlock",
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			tmpfs("/tmp", "mode=1777"),
			tmpfs("/run", "mode=0755"),
			tmpfs("/dev/shm", "mode=1777"),
			{Destination: AgentPath, Type: "bind", Source: b.agent, Options: []string{"rbind", "ro"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network", Path: b.netnsPath}},
		},
	}
	s.Mounts = append(s.Mounts, b.mounts...)
	if b.cgroupsPath != "" {
		const period = 100_000
		s.Linux.CgroupsPath = b.cgroupsPath
		s.Linux.Resources = &ociResources{
			Memory: &ociMemory{Limit: int64(spec.MemoryMiB) << 20},
			CPU:    &ociCPU{Quota: int64(spec.CPUs) * period, Period: period},
		}
	}
	out, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("oci spec: %w", err)
	}
	return out, nil
}

// instancePaths are the host paths of one instance, all under Spec.RunDir.
type instancePaths struct {
	root   string // runsc --root (state); removed after exit
	bundle string // holds config.json; removed after exit
	upper  string // runsc's overlay filestore dir; removed after exit
	logDir string // runsc debug logs (Config.Debug); kept
	// monitor, when the instance reports its execs (Spec.ProcAudit),
	// holds the trace session's config and the sink's socket (procaudit.go);
	// removed after exit.
	monitor string
}

// runscArgs returns runsc's argv (after the binary) to run container cid,
// or to restore it from s.RestoreFrom (a directory StateSaver.SaveState
// wrote). s.RootInPlace writes to the root directory itself: no overlay.
func runscArgs(c Config, p instancePaths, cid string, s runtime.Spec) []string {
	overlay := "root:dir=" + p.upper
	if c.DiskBytes > 0 {
		overlay += ",size=" + strconv.FormatInt(c.DiskBytes, 10)
	}
	if s.RootInPlace {
		overlay = "none"
	}
	netMode := "none"
	if s.Network {
		netMode = "sandbox"
	}
	args := []string{
		"--root=" + p.root,
		"--platform=" + c.Platform,
		"--network=" + netMode,
		"--overlay2=" + overlay,
		"--cpu-num-from-quota",
		// cgroup v2 inside: its pids controller is enforced and
		// hierarchical (v1's charges an arbitrary hierarchy).
		"--in-sandbox-cgroup=v2",
	}
	if c.IgnoreCgroups {
		args = append(args, "--ignore-cgroups")
	}
	if c.Debug {
		args = append(args, "--debug", "--debug-log="+p.logDir+"/")
	}
	if p.monitor != "" {
		args = append(args, "--pod-init-config="+filepath.Join(p.monitor, monitorConfig))
	}
	if s.RestoreFrom != "" {
		return append(args, "restore", "--image-path="+s.RestoreFrom, "--bundle", p.bundle, cid)
	}
	return append(args, "run", "--bundle", p.bundle, cid)
}
