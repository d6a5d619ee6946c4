package qemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// TSC frequency for tsc_early_khz. Under TCG without icount the guest TSC
// runs at the host's rate, and the guest clock drifts by the same relative
// error as this value, so it must be exact (notes §1).

// tscSnapPPM: a measurement this close to the kernel's own calibration is
// taken to be that value. The kernel's tsc_khz is what CLOCK_MONOTONIC_RAW
// is derived from when the host clocksource is the TSC, so using it keeps
// guest and host clocks in step.
const tscSnapPPM = 50

// tscCache is StateDir/tsc.json.
type tscCache struct {
	BootID string `json:"boot_id"`
	KHz    int64  `json:"khz"`
	Source string `json:"source"`
}

// hostTSCkHz returns the host TSC frequency, from the cache in stateDir if
// it was found since this boot, else from sysfs or a measurement.
func hostTSCkHz(stateDir string) (int64, string, error) {
	bootID := hostBootID()
	path := filepath.Join(stateDir, "tsc.json")
	if b, err := os.ReadFile(path); err == nil {
		var c tscCache
		if json.Unmarshal(b, &c) == nil && c.BootID == bootID && bootID != "" && c.KHz > 0 {
			return c.KHz, c.Source + " (cached)", nil
		}
	}
	khz, src, err := findTSCkHz()
	if err != nil {
		return 0, "", err
	}
	if b, err := json.Marshal(tscCache{BootID: bootID, KHz: khz, Source: src}); err == nil {
		_ = runtime.WriteFileAtomic(path, b, 0o600)
	}
	return khz, src, nil
}

func findTSCkHz() (int64, string, error) {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			return v, "sysfs tsc_freq_khz", nil
		}
	}
	if !haveRDTSC {
		return 0, "", errors.New("tsc: no tsc_freq_khz in sysfs and no RDTSC on this architecture")
	}
	measured, err := measureTSCkHz(5, 120*time.Millisecond)
	if err != nil {
		return 0, "", err
	}
	if k := kernelTSCkHz(); k > 0 && math.Abs(float64(measured-k))/float64(k)*1e6 <= tscSnapPPM {
		return k, fmt.Sprintf("kernel calibration (measured %d)", measured), nil
	}
	return measured, "measured", nil
}

// measureTSCkHz times RDTSC against CLOCK_MONOTONIC_RAW over rounds
// intervals and returns the median, in kHz.
func measureTSCkHz(rounds int, interval time.Duration) (int64, error) {
	var vals []float64
	for range rounds {
		t0, c0, err := tscSample()
		if err != nil {
			return 0, err
		}
		time.Sleep(interval)
		t1, c1, err := tscSample()
		if err != nil {
			return 0, err
		}
		if t1 <= t0 || c1 <= c0 {
			return 0, errors.New("tsc: clock or counter went backwards")
		}
		vals = append(vals, float64(c1-c0)/float64(t1-t0)*1e6)
	}
	slices.Sort(vals)
	return int64(math.Round(vals[len(vals)/2])), nil
}

// tscSample reads CLOCK_MONOTONIC_RAW bracketed by two RDTSCs, several
// times, and keeps the tightest bracket's midpoint.
func tscSample() (ns int64, tsc uint64, err error) {
	best := uint64(math.MaxUint64)
	for range 16 {
		a := rdtsc()
		t, err := monotonicRaw()
		b := rdtsc()
		if err != nil {
			return 0, 0, err
		}
		if b > a && b-a < best {
			best, ns, tsc = b-a, t, a+(b-a)/2
		}
	}
	if best == math.MaxUint64 {
		return 0, 0, errors.New("tsc: counter not increasing")
	}
	return ns, tsc, nil
}

func monotonicRaw() (int64, error) {
	const clockMonotonicRaw = 4
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonicRaw, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, fmt.Errorf("clock_gettime: %w", e)
	}
	return ts.Nano(), nil
}

var kernelTSCRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`tsc: (?:Refined TSC clocksource calibration: |Detected )([0-9]+)\.([0-9]{3}) MHz`)
})

// kernelTSCkHz returns the kernel's TSC calibration from its log (the
// refined value if there is one), or 0.
func kernelTSCkHz() int64 {
	// /dev/kmsg hands out one record per read and blocks at the end, so
	// read it raw and non-blocking (the Go poller would wait forever).
	fd, err := syscall.Open("/dev/kmsg", syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer syscall.Close(fd)
	return parseKernelTSC(func(p []byte) (int, error) {
		for {
			n, err := syscall.Read(fd, p)
			if err == syscall.EPIPE {
				continue // records were overwritten while we read
			}
			if err != nil {
				return 0, err
			}
			if n <= 0 {
				return 0, io.EOF
			}
			return n, nil
		}
	})
}

// parseKernelTSC scans kernel log records returned by read until it fails.
func parseKernelTSC(read func([]byte) (int, error)) int64 {
	var khz int64
	buf := make([]byte, 8192)
	for range 1 << 20 {
		n, err := read(buf)
		if err != nil {
			return khz
		}
		for _, line := range bytes.Split(buf[:n], []byte("\n")) {
			if m := kernelTSCRe().FindSubmatch(line); m != nil {
				mhz, _ := strconv.ParseInt(string(m[1]), 10, 64)
				frac, _ := strconv.ParseInt(string(m[2]), 10, 64)
				khz = mhz*1000 + frac // a later "Refined" line wins
			}
		}
	}
	return khz
}

// hostBootID identifies this boot of the host ("" if unknown).
func hostBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// HostTSCkHz returns the host TSC frequency in kHz as the runtime passes it
// to TCG guests (tsc_early_khz), cached in stateDir. For tools (bench) that
// boot a guest outside the runtime.
func HostTSCkHz(stateDir string) (int64, error) {
	khz, _, err := hostTSCkHz(stateDir)
	return khz, err
}
