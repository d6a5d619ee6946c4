package boot

import (
	"strconv"
	"strings"
)

// Cmdline holds the airlock.* options of the kernel command line.
type Cmdline struct {
	// Root is the root block device (airlock.root=, default /dev/vda).
	Root string
	// Probe skips the root disk and serves from the initramfs
	// (airlock.probe=1): the host only wants to know that a guest boots.
	Probe bool
	// Hostname is the initial hostname (airlock.hostname=, default "airlock").
	Hostname string
	// Pids is the default pids limit of an exec (airlock.pids=, default 1024).
	Pids uint32
	// Debug turns on debug logging on the console (airlock.debug=1).
	Debug bool
}

// DefaultCmdline returns the values used when an option is absent or invalid.
func DefaultCmdline() Cmdline {
	return Cmdline{Root: "/dev/vda", Hostname: "airlock", Pids: 1024}
}

// ParseCmdline parses /proc/cmdline. Unknown words are ignored; invalid
// values keep the default.
func ParseCmdline(s string) Cmdline {
	c := DefaultCmdline()
	for _, w := range strings.Fields(s) {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "airlock.root":
			if strings.HasPrefix(v, "/dev/") && !strings.Contains(v, "..") {
				c.Root = v
			}
		case "airlock.probe":
			c.Probe = v == "1" || v == "true" || v == "yes"
		case "airlock.hostname":
			if v != "" {
				c.Hostname = v
			}
		case "airlock.debug":
			c.Debug = v == "1" || v == "true" || v == "yes"
		case "airlock.pids":
			if n, err := strconv.ParseUint(v, 10, 32); err == nil && n > 0 {
				c.Pids = uint32(n)
			}
		}
	}
	return c
}
