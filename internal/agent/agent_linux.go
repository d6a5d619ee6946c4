package agent

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/boot"
	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

const (
	minEntropy = 32
	maxEntropy = 512
)

// minSyncTime is the earliest wall clock Sync accepts (2020-01-01 UTC).
var minSyncTime = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// agentService implements AgentService.
type agentService struct {
	log     *slog.Logger
	version string
	sys     system
	// powerOffDelay lets the Shutdown reply reach the host first.
	powerOffDelay time.Duration
	// wg owns the power-off goroutine.
	wg *sync.WaitGroup

	once sync.Once

	// netMu guards lastNet, the network config last applied in full. A
	// Sync asking for the same one again (a clone restored from a template
	// that applied it) skips the ~25 ms of netlink and file work: nothing
	// but root in this guest could have changed it, which only affects
	// this guest.
	netMu   sync.Mutex
	lastNet *netConfig

	// procStreams counts open ProcEvents streams (procevents_linux.go).
	procStreams atomic.Int32
}

var _ agentv1connect.AgentServiceHandler = (*agentService)(nil)

func (a *agentService) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	resp := &agentv1.InfoResponse{
		ProtocolVersion: agentapi.ProtocolVersion,
		AgentVersion:    a.version,
		MemTotalBytes:   memTotal(),
		Cpus:            onlineCPUs(),
	}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		resp.KernelRelease = unix.ByteSliceToString(uts.Release[:])
	}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) == nil {
		resp.UptimeSeconds = float64(ts.Nano()) / 1e9
	}
	return connect.NewResponse(resp), nil
}

func (a *agentService) Sync(_ context.Context, req *connect.Request[agentv1.SyncRequest]) (*connect.Response[agentv1.SyncResponse], error) {
	m := req.Msg
	if n := len(m.GetEntropy()); n < minEntropy || n > maxEntropy {
		return nil, invalidf("entropy must be %d to %d bytes", minEntropy, maxEntropy)
	}
	if m.GetUnixNano() < minSyncTime.UnixNano() {
		return nil, invalidf("unix_nano is before 2020")
	}
	if h := m.GetHostname(); h != "" && !boot.ValidHostname(h) {
		return nil, invalidf("hostname is not a valid RFC 1123 label")
	}
	var netCfg netConfig
	if m.GetNetwork() != nil {
		var err error
		if netCfg, err = parseNetworkConfig(m.GetNetwork()); err != nil {
			return nil, err
		}
	}
	vols, err := parseVolumes(m.GetVolumes())
	if err != nil {
		return nil, err
	}
	resp := &agentv1.SyncResponse{GuestUnixNanoBefore: time.Now().UnixNano()}
	if err := a.sys.SetClock(time.Unix(0, m.GetUnixNano())); err != nil {
		return nil, sysError("set clock", err)
	}
	if err := a.sys.AddEntropy(m.GetEntropy()); err != nil {
		return nil, sysError("add entropy", err)
	}
	if h := m.GetHostname(); h != "" {
		if err := a.sys.SetHostname(h); err != nil {
			return nil, sysError("set hostname", err)
		}
	}
	if m.GetNetwork() != nil {
		if err := a.configureNetwork(netCfg); errors.Is(err, errNoNIC) {
			return nil, preconditionf("network: the guest has no network interface")
		} else if err != nil {
			a.log.Warn("configure network", "err", err)
			return nil, sysError("configure network", err)
		}
	}
	if m.GetGrowRoot() {
		if err := a.sys.GrowRoot(m.GetRootDiskBytes()); errors.Is(err, errNoRootDisk) {
			return nil, preconditionf("grow root: no root disk")
		} else if err != nil {
			a.log.Warn("grow root", "err", err)
			return nil, sysError("grow root", err)
		}
	}
	if len(vols) > 0 {
		if err := a.sys.MountVolumes(vols); err != nil {
			a.log.Warn("mount volumes", "err", err)
			return nil, sysError("mount volumes", err)
		}
	}
	size, err := a.sys.RootSize()
	if err != nil {
		return nil, sysError("root size", err)
	}
	resp.RootSizeBytes = size
	return connect.NewResponse(resp), nil
}

// Shutdown replies, then powers off after powerOffDelay. A second call gets
// the same reply and changes nothing.
func (a *agentService) Shutdown(context.Context, *connect.Request[agentv1.ShutdownRequest]) (*connect.Response[agentv1.ShutdownResponse], error) {
	a.once.Do(func() {
		a.log.Info("shutdown requested")
		a.wg.Go(func() {
			time.Sleep(a.powerOffDelay)
			a.sys.PowerOff()
		})
	})
	return connect.NewResponse(&agentv1.ShutdownResponse{}), nil
}

// memTotal reads MemTotal from /proc/meminfo, in bytes.
func memTotal() uint64 { return meminfo("MemTotal") }

// meminfo reads one field of /proc/meminfo, in bytes (0 if absent).
func meminfo(field string) uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// onlineCPUs counts /sys/devices/system/cpu/online ("0-3,5").
func onlineCPUs() uint32 {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return uint32(runtime.NumCPU())
	}
	n, err := countCPUList(strings.TrimSpace(string(b)))
	if err != nil || n == 0 {
		return uint32(runtime.NumCPU())
	}
	return n
}

func countCPUList(s string) (uint32, error) {
	var n uint32
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return 0, err
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return 0, err
			}
		}
		if b < a {
			return 0, errors.New("bad cpu range")
		}
		n += uint32(b - a + 1)
	}
	return n, nil
}

// configureNetwork applies c unless it is the config last applied.
func (a *agentService) configureNetwork(c netConfig) error {
	a.netMu.Lock()
	defer a.netMu.Unlock()
	if a.lastNet != nil && a.lastNet.equal(c) {
		return nil
	}
	a.lastNet = nil
	if err := a.sys.ConfigureNetwork(c); err != nil {
		return err
	}
	a.lastNet = &c
	return nil
}
