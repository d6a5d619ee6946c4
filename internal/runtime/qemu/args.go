package qemu

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// AgentPortName is the virtio-serial port the guest agent looks for.
const AgentPortName = "airlock"

// ProbeKernelArg makes the guest agent serve from the initramfs without a
// root disk (used by the KVM probe).
const ProbeKernelArg = "airlock.probe=1"

// The inherited descriptors, in QEMU's fd table (exec.Cmd.ExtraFiles
// starts at 3). The order is fixed so that argv stays comparable between a
// template and its clones.
const (
	fdConsole  = 3
	fdQMP      = 4
	fdAgent    = 5
	fdDisk     = 6 // absent for the probe guest
	fdMem      = 7 // RAM file (Snapshottable) or sealed memfd (restore)
	fdIncoming = 8 // state.bin of a restore
	fdNet      = 9 // QEMU's end of the NIC's stream socketpair (Spec.Network)
	// fdVolume0 + i is the image of Spec.Mounts[i] (volumes only).
	fdVolume0 = 10
)

// volumeFDSet0 + i is the -add-fd set of Spec.Mounts[i].
const volumeFDSet0 = 10

// GuestMAC is the MAC address of every guest's NIC.
const GuestMAC = netconf.GuestMAC

// diskFDSet is the -add-fd set holding the root disk.
const diskFDSet = 1

// argConfig is what buildArgs needs beyond the Spec.
type argConfig struct {
	// Accel is "kvm" or "tcg".
	Accel string
	// TSCkHz is passed as tsc_early_khz under TCG (0: omitted).
	TSCkHz int64
	// Probe builds the KVM probe guest: no root disk, no RNG.
	Probe bool
	// Legacy is the machine profile before machineV2, for restoring a
	// snapshot taken on it.
	Legacy bool
}

// fdLayout says which optional descriptors are present.
type fdLayout struct {
	Disk bool // the root disk at fdDisk
	// Mem: RAM comes from /proc/self/fd/fdMem. Otherwise (except for the
	// probe guest) it is anonymous (memory-backend-ram). Both backends
	// have the id "mem", so RAM migrates between any two layouts.
	Mem      bool
	MemShare bool // share=on (template) or share=off (restored clone)
	Incoming bool // -incoming defer; the state arrives as fd:fdIncoming
	Net      bool // a virtio-net NIC on the stream socket fdNet
	// FS: Spec.Mounts has host directories (virtio-fs), whose
	// vhost-user daemons need the guest's RAM shared (memfd) and the
	// modern virtio-mmio layout.
	FS bool
}

// buildArgs returns QEMU's argv (without argv[0]). It is pure: the same
// inputs give the same argv, which testdata/*.golden pins. Only the kernel
// and initramfs are paths; every other host endpoint is an inherited fd.
func buildArgs(cfg argConfig, spec runtime.Spec, fds fdLayout) []string {
	machine := "microvm,x-option-roms=off,isa-serial=on"
	if cfg.Accel != "kvm" && !cfg.Legacy {
		// No PIT under TCG: the guest kernel (6.1) leaves the one it does
		// not use counting, and QEMU's main loop woke 36 times a second
		// for its interrupts. The guest needs none: tsc_early_khz gives
		// the TSC, which calibrates the local APIC timer.
		machine += ",pit=off"
	}
	if fds.Mem || !cfg.Probe {
		machine += ",memory-backend=mem"
	}
	a := []string{
		"-name", "airlock-" + optEscape(spec.ID) + ",process=airlock-vm",
		"-M", machine,
	}
	if cfg.Accel == "kvm" {
		// The host's CPU without its virtualization extensions: a guest
		// gets no nested hypervisor to attack (threat 4).
		a = append(a, "-accel", "kvm", "-cpu", "host,-vmx,-svm")
	} else {
		// A 32 MiB translation cache instead of the default saves about
		// 12 MB per VM and did not slow boots (notes §8).
		cpu := tcgCPU
		if cfg.Legacy {
			cpu = tcgCPULegacy
		}
		a = append(a, "-accel", "tcg,tb-size=32", "-cpu", cpu)
	}
	a = append(a,
		"-m", strconv.Itoa(spec.MemoryMiB),
		"-smp", strconv.Itoa(spec.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
	)
	if fds.Mem {
		share := "off"
		if fds.MemShare {
			share = "on"
		}
		a = append(a, "-object", fmt.Sprintf(
			"memory-backend-file,id=mem,size=%dM,mem-path=/proc/self/fd/%d,share=%s",
			spec.MemoryMiB, fdMem, share))
	} else if fds.FS {
		// virtiofsd maps the guest's RAM. (Such a VM cannot be saved:
		// vhost-user-fs has no migration, so no template and no pause.)
		a = append(a, "-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", spec.MemoryMiB),
			"-global", "virtio-mmio.force-legacy=false")
	} else if !cfg.Probe {
		// The same RAM as -m alone, but its block is named "mem" like a
		// template's, so that SaveState streams restore into any layout.
		a = append(a, "-object", fmt.Sprintf("memory-backend-ram,id=mem,size=%dM", spec.MemoryMiB))
	}
	a = append(a,
		"-kernel", spec.Kernel,
		"-initrd", spec.Initrd,
		"-append", kernelCmdline(cfg, spec),
		"-chardev", fmt.Sprintf("socket,id=con,fd=%d,server=off", fdConsole),
		"-serial", "chardev:con",
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=off", fdQMP),
		"-mon", "chardev=qmp,mode=control",
		"-device", "virtio-serial-device",
		// A listening socket: the host can connect again after closing
		// (QEMU 7.2's virtio-serial ports cannot swap backends).
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", fdAgent),
		"-device", "virtserialport,chardev=agent,name="+AgentPortName,
	)
	if fds.Disk {
		format := spec.RootDiskFormat
		if format == "" {
			format = "qcow2"
		}
		// No image locks on the root disk's file: a live snapshot leaves
		// it as the backing file of a new overlay, and QEMU would go on
		// holding its write lock, refusing every restore of the snapshot
		// while the source runs. The host owns these files (the VMM's
		// uid can write only its own overlay, passed by descriptor).
		a = append(a,
			"-add-fd", fmt.Sprintf("fd=%d,set=%d", fdDisk, diskFDSet),
			"-blockdev", fmt.Sprintf("driver=%s,node-name=root,file.driver=file,file.filename=/dev/fdset/%d,file.locking=off", format, diskFDSet),
			"-device", "virtio-blk-device,drive=root",
		)
	}
	for i, m := range spec.Mounts {
		if cfg.Probe {
			break
		}
		if m.Dir != "" {
			// A host directory: virtio-fs, served by a virtiofsd on the
			// other end of fdVolume0+i, found by the guest by its tag.
			id := "fs" + strconv.Itoa(i)
			a = append(a,
				"-chardev", fmt.Sprintf("socket,id=%s,fd=%d", id, fdVolume0+i),
				"-device", fmt.Sprintf("vhost-user-fs-device,chardev=%s,tag=%s", id, runtime.MountTag(i)),
			)
			continue
		}
		// Raw ext4 images, each its own virtio-blk disk named by its
		// serial. Read-only ones are read-only devices: the guest's root
		// cannot write them (threat 8). Writable ones pass the guest's
		// discards to the image (fstrim frees host blocks) and its
		// flushes to the host's disk (fsync is durable).
		node := "vol" + strconv.Itoa(i)
		opts := "read-only=off,discard=unmap"
		if m.ReadOnly {
			opts = "read-only=on"
		}
		a = append(a,
			"-add-fd", fmt.Sprintf("fd=%d,set=%d", fdVolume0+i, volumeFDSet0+i),
			"-blockdev", fmt.Sprintf("driver=raw,node-name=%s,%s,file.driver=file,file.filename=/dev/fdset/%d", node, opts, volumeFDSet0+i),
			"-device", fmt.Sprintf("virtio-blk-device,drive=%s,serial=%s", node, runtime.MountSerial(i)),
		)
	}
	if fds.Net {
		// QEMU 7.2 has no reconnect= for stream netdevs: the link lives
		// exactly as long as this socketpair (notes §3).
		a = append(a,
			"-netdev", fmt.Sprintf("stream,id=net0,server=off,addr.type=fd,addr.str=%d", fdNet),
			"-device", "virtio-net-device,netdev=net0,mac="+GuestMAC,
		)
	}
	if !cfg.Probe {
		a = append(a,
			"-object", "rng-random,id=rng,filename=/dev/urandom",
			"-device", "virtio-rng-device,rng=rng",
		)
	}
	if fds.Incoming {
		a = append(a, "-incoming", "defer")
	}
	a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	return a
}

// kernelCmdline is the guest's command line: ours, then spec.KernelArgs.
func kernelCmdline(cfg argConfig, spec runtime.Spec) string {
	// An idle guest must not wake: each wakeup under TCG is a guest timer
	// interrupt that QEMU's main loop serves. No soft-lockup watchdog (a
	// timer every 4 s) and no proactive compaction (kcompactd every 0.5 s).
	args := []string{"console=ttyS0", "quiet", "panic=-1", "nowatchdog", "sysctl.vm.compaction_proactiveness=0"}
	if cfg.Accel != "kvm" && cfg.TSCkHz > 0 {
		// microvm has no HPET or PM timer; under TCG the PIT calibration
		// fails at random and the boot hangs (notes §1). With no second
		// clocksource to check it against, the TSC is never marked fit
		// for one-shot timers unless it is declared reliable, and without
		// that (and ARAT in the guest CPU) the guest ticks at HZ forever.
		// highres=off keeps timers at tick resolution while the tick
		// stops in idle: with high-resolution timers, Go's runtime in the
		// agent slept its 20 us polls for real, each a timer interrupt
		// under TCG, and create until the first exec took 80-100 ms more.
		args = append(args, "tsc_early_khz="+strconv.FormatInt(cfg.TSCkHz, 10), "tsc=reliable", "highres=off")
	}
	if cfg.Probe {
		args = append(args, ProbeKernelArg)
	}
	args = append(args, spec.KernelArgs...)
	return strings.Join(args, " ")
}

// optEscape escapes a value for QEMU's key=value,... option syntax.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// tcgCPU is the guest CPU under TCG: x86-64-v2 plus RDRAND, and ARAT (the
// local APIC timer keeps running in idle states), without which the guest
// kernel has no one-shot timer (microvm has no broadcast device) and
// cannot stop its periodic tick: an idle guest cost 3.8% of a core at
// HZ=250, 0.8% with it. Not "max": QEMU
// 7.2's TCG advertises AVX2, which Go's runtime (memmove, bytes.Index...)
// and glibc then use, and TCG emulates it slowly. Measured here: create
// until the first exec answers went from ~270 ms (max) to ~225 ms.
// qemu64 advertises SVM, which TCG emulates: it is turned off, so a guest
// has no nested hypervisor (threat 4).
const tcgCPU = "qemu64,+cx16,+lahf-lm,+popcnt,+pni,+ssse3,+sse4.1,+sse4.2,+rdrand,+arat,-svm"

// Machine profiles: what a snapshot's guest booted on, which its restore
// must reproduce. machineV2 is TCG without a PIT and with ARAT; "" (the
// profile before, snapshots without the field) had both the other way.
// KVM guests are the same in both.
const machineV2 = "2"

// tcgCPULegacy is the TCG guest CPU of the "" profile.
const tcgCPULegacy = "qemu64,+cx16,+lahf-lm,+popcnt,+pni,+ssse3,+sse4.1,+sse4.2,+rdrand,-svm"
