package agent

import (
	"context"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// userHZ is the unit of /proc/stat's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

// Usage reads the guest's CPU time, memory and root filesystem use.
func (a *agentService) Usage(context.Context, *connect.Request[agentv1.UsageRequest]) (*connect.Response[agentv1.UsageResponse], error) {
	r := &agentv1.UsageResponse{
		Cpus:              uint32(goruntime.NumCPU()),
		MemTotalBytes:     meminfo("MemTotal"),
		MemAvailableBytes: meminfo("MemAvailable"),
		MemCachedBytes:    meminfo("Cached"),
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		r.CpuBusyNs, r.CpuTotalNs = cpuTimes(string(b))
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err == nil {
		bs := uint64(st.Bsize)
		r.DiskTotalBytes = st.Blocks * bs
		r.DiskUsedBytes = (st.Blocks - st.Bfree) * bs
	}
	return connect.NewResponse(r), nil
}

// cpuTimes reads the "cpu" line of /proc/stat: the busy and the total
// time of all CPUs, in nanoseconds.
func cpuTimes(stat string) (busy, total uint64) {
	for line := range strings.SplitSeq(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		// user nice system idle iowait irq softirq steal (guest times
		// are already in user and nice).
		for i, v := range f[1:min(len(f), 9)] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, 0
			}
			ns := n * (1e9 / userHZ)
			total += ns
			if i != 3 && i != 4 { // idle, iowait
				busy += ns
			}
		}
		return busy, total
	}
	return 0, 0
}
