package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// serveOptions are serve's own settings (the global ones are in globals).
type serveOptions struct {
	config          string
	listen          string
	tlsCert, tlsKey string
	previewDomain   string
	drain           time.Duration
	accessLog       bool
	// hostMountRoots are the directories under which API callers may
	// mount host paths (--allow-host-mount, repeatable).
	hostMountRoots []string
	// templateRegistries are the registries template builds may pull
	// FROM images from (--template-registry, repeatable).
	templateRegistries []string
	// warmPools are --warm-pool's specs (parseWarmPool).
	warmPools []string
	// cluster: serve as a cluster's control tier (control.go).
	cluster clusterOptions
}

// maxDrain caps --drain.
const maxDrain = 24 * time.Hour

// validate checks o once flags, environment and config file are merged.
func (o *serveOptions) validate() error {
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return fmt.Errorf("%w: listen %q: %v (want host:port, e.g. 127.0.0.1:7070)", errdefs.ErrInvalid, o.listen, err)
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return fmt.Errorf("%w: TLS needs both a certificate and its key (--tls-cert and --tls-key, or tls.cert and tls.key), or neither", errdefs.ErrInvalid)
	}
	if o.drain < 0 || o.drain > maxDrain {
		return fmt.Errorf("%w: drain %v: must be between 0 and %v", errdefs.ErrInvalid, o.drain, maxDrain)
	}
	return nil
}

const serveLong = `Serve the HTTP API (sandboxes keep running when it stops).

Settings come from, first to last: flags on the command line; environment
variables (AIRLOCK_LISTEN, AIRLOCK_PREVIEW_DOMAIN, AIRLOCK_STATE_DIR,
AIRLOCK_RUNTIME, AIRLOCK_ACCEL, AIRLOCK_HOST_CGROUPS, AIRLOCK_DISK_RESERVE);
the config file
(--config or AIRLOCK_CONFIG, YAML: see /etc/airlock/airlock.yaml as
make install writes it); built-in defaults. Config keys: version (1),
listen, tls.cert, tls.key, preview_domain, drain, log.level, log.access,
state_dir, runtime, accel, host_cgroups, disk_reserve, allow_host_mount (a
list of directories); an unknown key is an error naming its line.

API keys may mount host directories into sandboxes only under the
directories --allow-host-mount names (none by default); the local CLI user
may mount any directory.

With --tls-cert and --tls-key the API is served over HTTPS (HTTP/2 too).
Logs go to stderr: one access line per request (method, path without its
query, status, bytes, duration, remote address, tenant and key id; never
headers, cookies or tokens) unless --access-log=false, and lines when
serving starts and stops. The API's spec is at GET /v1/openapi.yaml and
Prometheus metrics at GET /metrics (neither needs a key).`

func serveCmd(g *globals) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (sandboxes keep running when it stops)",
		Long:  serveLong,
		Args:  cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			// A server logs at info unless told otherwise (the CLI's
			// default, warn, would hide its start and stop).
			if !cmd.Flags().Changed("log-level") {
				g.logLevel = "info"
			}
			if o.config != "" {
				vals, err := readServeConfig(o.config)
				if err != nil {
					return err
				}
				if err := applyServeConfig(cmd.Flags(), o.config, vals, os.Getenv); err != nil {
					return err
				}
			}
			if err := g.setup(); err != nil {
				return err
			}
			return o.validate()
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.cluster.enabled {
				return runControl(cmd, g, o)
			}
			return g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
				return runServe(cmd, g, m, o)
			})(cmd, args)
		},
	}
	serveFlags(cmd, o)
	return cmd
}

// runServe serves the API of the state dir's manager m until the
// command's context ends.
func runServe(cmd *cobra.Command, g *globals, m *sandbox.Manager, o *serveOptions) error {
	roots, err := hostMountRoots(o.hostMountRoots, m.L.Root)
	if err != nil {
		return err
	}
	m.HostMountRoots = roots
	for _, h := range o.templateRegistries {
		m.TemplateRegistries = append(m.TemplateRegistries, sandbox.NormalizeRegistry(h))
	}
	for i, spec := range o.warmPools {
		p, err := parseWarmPool(spec)
		if err != nil {
			return err
		}
		if err := m.SetWarmPool(fmt.Sprintf("serve-%d", i+1), p); err != nil {
			return err
		}
	}
	if len(o.warmPools) > 0 {
		ctx, cancel := context.WithCancel(cmd.Context())
		defer cancel()
		go m.RunWarm(ctx)
	}
	setOOMScoreAdj(g.log, oomAdjServe)
	var tlsConf *tls.Config
	if o.tlsCert != "" {
		if tlsConf, err = loadTLS(o.tlsCert, o.tlsKey, g.log); err != nil {
			return err
		}
	}
	var access *slog.Logger
	if o.accessLog {
		access = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	s, closeMCP, err := newAPIServer(cmd.Context(), g, m, o.previewDomain, access)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	warnPlainHTTP(g.log, ln.Addr(), tlsConf)
	return serveAPI(cmd.Context(), s, ln, tlsConf, o.drain, closeMCP, cmd.OutOrStdout(), g.log)
}

func serveFlags(cmd *cobra.Command, o *serveOptions) {
	o.cluster.flags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.config, "config", os.Getenv("AIRLOCK_CONFIG"), "YAML config `file` (env AIRLOCK_CONFIG); flags and environment variables override it")
	f.StringVar(&o.listen, "listen", cmp.Or(os.Getenv("AIRLOCK_LISTEN"), "127.0.0.1:7070"), "address to listen on (env AIRLOCK_LISTEN)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate `file` (chain first to last; needs --tls-key)")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert (not readable by every user)")
	f.StringVar(&o.previewDomain, "preview-domain", os.Getenv("AIRLOCK_PREVIEW_DOMAIN"), "serve port P of sandbox ID at http://P-ID.`DOMAIN`/ (a wildcard DNS name, or localhost:7070 with a Host header; env AIRLOCK_PREVIEW_DOMAIN); E2B's getHost returns such hosts")
	f.DurationVar(&o.drain, "drain", 30*time.Second, "on SIGTERM/SIGINT, how long requests in flight (exec streams too) may run before they are cut")
	f.BoolVar(&o.accessLog, "access-log", true, "log one line per request to stderr")
	f.StringArrayVar(&o.hostMountRoots, "allow-host-mount", nil, "let API keys mount host directories under `DIR` into sandboxes (repeatable; absolute, an existing directory with no symlink in its path; the local CLI user may mount any directory)")
	f.StringArrayVar(&o.warmPools, "warm-pool", nil, "keep sandboxes started ahead of the creates that take them: `image=NAME,size=N[,cpus=N][,memory=MiB]` (repeatable; size at most 64). A create of that image, CPUs and memory with no volumes, host directories or ports takes one in milliseconds instead of starting one")
	f.StringArrayVar(&o.templateRegistries, "template-registry", nil, "let template builds pull their FROM image from the OCI registry `HOST` (repeatable; e.g. docker.io, ghcr.io, registry.internal:5000; none by default: the server connects there itself)")
}

// hostMountRoots checks --allow-host-mount's directories once, at start:
// absolute, clean, existing directories with no symlink in any component
// (a root that is or passes through a link could be moved later), not /,
// and neither holding nor inside the state dir stateDir.
func hostMountRoots(dirs []string, stateDir string) ([]string, error) {
	state := filepath.Clean(stateDir)
	var out []string
	for _, d := range dirs {
		bad := func(why string) error {
			return fmt.Errorf("%w: --allow-host-mount %q: %s", errdefs.ErrInvalid, d, why)
		}
		switch {
		case !filepath.IsAbs(d):
			return nil, bad("must be an absolute path")
		case filepath.Clean(d) != d && filepath.Clean(d)+"/" != d:
			return nil, bad("must be clean (no '.', '..' or '//')")
		}
		d = filepath.Clean(d)
		switch {
		case d == "/":
			return nil, bad("allowing / would share the whole host: name the directories to share")
		case d == state || strings.HasPrefix(d, state+"/") || strings.HasPrefix(state, d+"/"):
			return nil, bad("holds or is inside airlock's state dir " + state)
		}
		fd, err := runtime.OpenDirNoSymlinks(d)
		if err != nil {
			return nil, bad(err.Error())
		}
		_ = unix.Close(fd)
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out, nil
}

// newAPIServer builds the API server of serve over m: the /v1 API, MCP at
// /mcp and E2B's routes. The returned func ends the MCP sessions.
func newAPIServer(ctx context.Context, g *globals, m *sandbox.Manager, previewDomain string, access *slog.Logger) (*api.Server, func(context.Context) error, error) {
	// One secret of the state dir derives every per-sandbox token (E2B's
	// access tokens, preview tokens).
	secret, err := m.Store.Secret(ctx, "secret.tokens")
	if err != nil {
		return nil, nil, err
	}
	cfg := api.Config{Sandboxes: m, Files: m, Execs: m, Contexts: m, Ports: m, Snapshots: m, Volumes: m, Secrets: m, Templates: m, Browsers: m, Events: m.Store, Keys: m.Store, Log: g.log,
		PreviewDomain: previewDomain, Secret: secret, AccessLog: access}
	s, err := api.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	closeMCP, err := mountMCP(g, s, m)
	if err != nil {
		return nil, nil, err
	}
	// E2B's execs go through the server's, which count them by tenant.
	if err := e2b.Register(s, e2b.Config{Sandboxes: m, Execs: s.Execs(), Files: m, Contexts: m, Snapshots: m, Secret: secret, Limiter: s.AllowTenant,
		Domain: previewDomain, Log: g.log}); err != nil {
		return nil, nil, err
	}
	return s, closeMCP, nil
}

// loadTLS loads a certificate and its key for serving HTTPS. A key file
// every user may read is refused; a certificate that is not valid now is
// served with a warning (clients will say why they refuse it).
func loadTLS(certFile, keyFile string, log *slog.Logger) (*tls.Config, error) {
	fi, err := os.Stat(keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: tls key %s is not a regular file", errdefs.ErrInvalid, keyFile)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return nil, fmt.Errorf("%w: tls key %s may be read by every user: chmod o-r it (e.g. 0600)", errdefs.ErrInvalid, keyFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: tls certificate %s and key %s: %v", errdefs.ErrInvalid, certFile, keyFile, err)
	}
	if leaf := cert.Leaf; leaf != nil {
		if now := time.Now(); now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
			log.Warn("the TLS certificate is not valid now", "file", certFile, "not_before", leaf.NotBefore, "not_after", leaf.NotAfter)
		}
		log.Info("TLS certificate", "subject", leaf.Subject.String(), "dns_names", leaf.DNSNames, "not_after", leaf.NotAfter)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// warnPlainHTTP warns when the API is served without TLS where other
// hosts may reach it.
func warnPlainHTTP(log *slog.Logger, addr net.Addr, tlsConf *tls.Config) {
	if tlsConf == nil && !isLoopback(addr) {
		log.Warn("serving plain HTTP on an address other hosts may reach: API keys and data cross the network in clear; set tls.cert and tls.key (--tls-cert, --tls-key), or put a TLS proxy in front",
			"addr", addr.String())
	}
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// serveAPI serves s on ln (HTTPS with HTTP/2 when tlsConf is set) until
// ctx ends, then stops gracefully: no new connections; requests in flight
// (exec streams and terminals too) run to their end for up to drain, then
// are cut with a line that says so (their execs go on in the shims). It
// logs when serving starts, when stopping starts (with the requests in
// flight and the drain) and when it is over (how long it took and whether
// requests were cut). closeMCP (may be nil) ends the MCP sessions first.
func serveAPI(ctx context.Context, s *api.Server, ln net.Listener, tlsConf *tls.Config, drain time.Duration,
	closeMCP func(context.Context) error, out io.Writer, log *slog.Logger,
) error {
	srv, cut := s.NewHTTPServer(ln.Addr().String())
	scheme := "http"
	if tlsConf != nil {
		srv.TLSConfig, scheme = tlsConf, "https"
	}
	errc := make(chan error, 1)
	go func() {
		if tlsConf != nil {
			errc <- srv.ServeTLS(ln, "", "") // the certificate is in TLSConfig
			return
		}
		errc <- srv.Serve(ln)
	}()
	fmt.Fprintf(out, "airlock API listening on %s://%s\n", scheme, ln.Addr())
	log.Info("serving", "addr", ln.Addr().String(), "tls", tlsConf != nil)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	t0 := time.Now()
	log.Info("shutting down", "cause", context.Cause(ctx).Error(), "in_flight", s.InFlight(), "drain", drain)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	var err error
	if closeMCP != nil {
		err = closeMCP(dctx) // MCP first: its streams hold connections open
	}
	// Shutdown waits for the connections it tracks; WaitIdle also for the
	// hijacked ones (terminal WebSockets).
	serr := srv.Shutdown(dctx)
	if serr == nil {
		serr = s.WaitIdle(dctx)
	}
	cutN, wasCut := 0, serr != nil
	if wasCut {
		cutN = s.InFlight()
		log.Warn("drain time is up: cutting the requests still in flight", "in_flight", cutN, "drain", drain)
		cut()
		ctx2, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel2()
		if serr := srv.Shutdown(ctx2); serr != nil {
			err = errors.Join(err, srv.Close())
		}
		if werr := s.WaitIdle(ctx2); werr != nil {
			log.Warn("requests still running after the cut", "in_flight", s.InFlight())
		}
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	log.Info("stopped", "took", time.Since(t0).Round(time.Millisecond), "cut", wasCut, "cut_requests", cutN)
	return err
}

// parseWarmPool reads a --warm-pool spec: image=NAME,size=N[,cpus=N]
// [,memory=MiB], each key once; size is required.
func parseWarmPool(spec string) (sandbox.WarmPool, error) {
	var p sandbox.WarmPool
	seen := map[string]bool{}
	bad := func(why string) (sandbox.WarmPool, error) {
		return sandbox.WarmPool{}, fmt.Errorf("%w: --warm-pool %q: %s (want image=NAME,size=N[,cpus=N][,memory=MiB])", errdefs.ErrInvalid, spec, why)
	}
	for kv := range strings.SplitSeq(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return bad(fmt.Sprintf("%q is not key=value", kv))
		}
		if seen[k] {
			return bad(k + " given twice")
		}
		seen[k] = true
		if k == "image" {
			p.Image = v
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return bad(k + " must be a whole number")
		}
		switch k {
		case "size":
			p.Size = n
		case "cpus":
			p.CPUs = n
		case "memory":
			p.MemoryMiB = n
		default:
			return bad("unknown key " + k)
		}
	}
	if !seen["size"] || p.Size < 1 {
		return bad("size must be at least 1")
	}
	return p, nil
}
