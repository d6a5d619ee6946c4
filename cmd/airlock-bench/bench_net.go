package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/airlock-sandbox/airlock/internal/envknob"
)

// benchPublicIP is the address the guest dials in the network rows. The
// shim's dial-map test hook (envknob.TestDialMap) sends it to 127.0.0.1,
// so the policy decides on a public address and the bytes land on a
// listener of this host; nothing leaves the machine.
const benchPublicIP = "93.184.215.10"

// netBench measures the sandbox network: TCP throughput through the
// user-space stack both ways, and connection setup as the guest sees it
// (connect() returns once the shim has dialled the host listener and
// completed the guest's handshake).
func netBench(ctx context.Context, c airlockCLI, mib, conns int) ([][3]string, error) {
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	var received atomic.Int64
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// A 1-byte request means "send me mib MiB"; otherwise drain.
				b := make([]byte, 1)
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if b[0] == 'G' {
					buf := make([]byte, 1<<20)
					for range mib {
						if _, err := c.Write(buf); err != nil {
							return
						}
					}
					return
				}
				n, _ := io.Copy(io.Discard, c)
				received.Add(n)
			}()
		}
	}()
	port := sink.Addr().(*net.TCPAddr).Port
	cli := c.run
	// The hook reaches this sandbox's shim only: `airlock create` passes
	// its environment to the shim it starts.
	id, err := c.runEnv([]string{envknob.TestDialMap.Setting(benchPublicIP + "=127.0.0.1")}, "create")
	if err != nil {
		return nil, err
	}
	defer func() { _, _ = cli("rm", id) }()
	script := fmt.Sprintf(`
import socket, time, statistics
A = (%q, %d)
MIB = %d
buf = b"x" * (1 << 20)
def up():
    s = socket.create_connection(A); t = time.perf_counter()
    s.sendall(b"P")
    for _ in range(MIB): s.sendall(buf)
    s.shutdown(socket.SHUT_WR); s.recv(1); d = time.perf_counter() - t; s.close(); return d
def down():
    s = socket.create_connection(A); t = time.perf_counter(); s.sendall(b"G"); n = 0
    while True:
        b = s.recv(1 << 20)
        if not b: break
        n += len(b)
    d = time.perf_counter() - t; s.close(); assert n == MIB << 20, n; return d
lat = []
for _ in range(%d):
    t = time.perf_counter(); s = socket.create_connection(A); lat.append(time.perf_counter() - t); s.sendall(b"P"); s.close()
u = min(up() for _ in range(2)); d = min(down() for _ in range(2))
print(MIB / u, MIB / d, statistics.median(lat) * 1000, min(lat) * 1000, max(lat) * 1000)
`, benchPublicIP, port, mib, conns)
	out, err := cli("exec", id, "--", "python3", "-c", script)
	if err != nil {
		return nil, fmt.Errorf("guest network bench: %w", err)
	}
	f := strings.Fields(out)
	if len(f) != 5 {
		return nil, fmt.Errorf("guest network bench printed %q", out)
	}
	v := make([]float64, 5)
	for i := range f {
		if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil, fmt.Errorf("guest network bench printed %q", out)
		}
	}
	// Two uploads of mib MiB must have arrived in full at the host.
	if got, want := received.Load(), int64(2*mib)<<20; got < want {
		return nil, fmt.Errorf("host listener received %d bytes of uploads, want at least %d", got, want)
	}
	note := fmt.Sprintf("%d MiB, best of 2, guest python3 -> netstack -> 127.0.0.1 listener", mib)
	return [][3]string{
		{"TCP throughput guest -> host listener (through the shim's netstack)", fmt.Sprintf("%.0f MB/s", v[0]*1.048576), note},
		{"TCP throughput host listener -> guest", fmt.Sprintf("%.0f MB/s", v[1]*1.048576), note},
		{"TCP connection setup, as the guest sees connect()", fmt.Sprintf("%.1f ms", v[2]), fmt.Sprintf("median of %d sequential connects (min %.1f, max %.1f); includes the policy decision and the shim's upstream dial", conns, v[3], v[4])},
	}, nil
}
