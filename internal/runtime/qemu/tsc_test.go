package qemu

import (
	"strings"
	"testing"
	"time"
)

func TestParseKernelTSC(t *testing.T) {
	log := "6,120,22,-;tsc: Detected 2599.996 MHz processor\n" +
		"6,300,144591,-;clocksource: tsc: mask: 0xffffffffffffffff\n" +
		"6,301,1144591,-;tsc: Refined TSC clocksource calibration: 2700.001 MHz\n"
	if got := parseKernelTSC(strings.NewReader(log).Read); got != 2700001 {
		t.Fatalf("got %d", got)
	}
	if got := parseKernelTSC(strings.NewReader("6,120,22,-;tsc: Detected 2599.996 MHz processor\n").Read); got != 2599996 {
		t.Fatalf("got %d", got)
	}
	if got := parseKernelTSC(strings.NewReader("nothing\n").Read); got != 0 {
		t.Fatalf("got %d", got)
	}
}

func TestMeasureTSC(t *testing.T) {
	if !haveRDTSC {
		t.Skip("no RDTSC on this architecture")
	}
	khz, err := measureTSCkHz(3, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if khz < 100_000 || khz > 10_000_000 {
		t.Fatalf("implausible TSC %d kHz", khz)
	}
	t.Logf("TSC %d kHz (kernel says %d)", khz, kernelTSCkHz())
}
