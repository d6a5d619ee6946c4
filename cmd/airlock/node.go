package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"reflect"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

type nodeOptions struct {
	name, listen, advertise string
	kubeconfig, namespace   string
	tokenFile               string
	tlsCert, tlsKey         string
	bundleDir               string
	drain                   time.Duration
}

const nodeLong = `Run this host as a node of an airlock cluster on Kubernetes.

The node owns its sandboxes as a single host does (its state dir, its
shims), and serves the sandbox API to the cluster's control tier only: the
one credential it accepts is the node token (--node-token-file, the same
secret the control tier holds), with the caller the control tier
authenticated in the X-Airlock-Caller header. Tenant API keys do not work
here.

It registers with the Kubernetes API: a Lease node-NAME in --namespace,
renewed three times per 10 s (a node that stops renewing it is lost to the
control tier 10 s later), and an AirlockNode object NAME with --advertise,
its runtime, guest kernel, CPUs and memory, and what its sandboxes hold.
Apply deploy/kubernetes first (kubectl apply -k deploy/kubernetes); the
node needs the airlock-node service account's rights. The Kubernetes
credentials are --kubeconfig's (env KUBECONFIG), or the pod's service
account when it runs in a pod.

With --bundle-dir, a directory every node mounts, a pause through the
control tier also writes the sandbox's bundle there (its saved memory,
devices and disk, named by its sha256); if this node is then lost, the
next call to the sandbox resumes it on another node, which checks the
bundle's digest and that it has the same architecture, runtime, guest
kernel, initramfs and image. Sandboxes with volumes, host directories or
secret values stay on their node.

The control tier is airlock serve --cluster: see the README's Cluster
section.`

func nodeCmd(g *globals) *cobra.Command {
	o := &nodeOptions{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run this host as a node of an airlock cluster on Kubernetes",
		Long:  nodeLong,
		Args:  cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("log-level") {
				g.logLevel = "info"
			}
			if err := g.setup(); err != nil {
				return err
			}
			return o.validate()
		},
		RunE: g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, _ []string) error {
			return runNode(cmd, g, m, o)
		}),
	}
	host, _ := os.Hostname()
	f := cmd.Flags()
	f.StringVar(&o.name, "name", strings.ToLower(strings.Split(host, ".")[0]), "the node's `name` in the cluster (a DNS label; default the host name)")
	f.StringVar(&o.listen, "listen", "0.0.0.0:7443", "address the node API listens on")
	f.StringVar(&o.advertise, "advertise", "", "the node API's base `URL` as the control tier reaches it (default: https://HOST:PORT of --listen, the host name if it listens on every address; http:// without TLS)")
	f.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig `file` for the Kubernetes API (env KUBECONFIG; empty: the pod's service account)")
	f.StringVar(&o.namespace, "namespace", cluster.DefaultNamespace, "Kubernetes namespace of the nodes' Leases and AirlockNodes")
	f.StringVar(&o.tokenFile, "node-token-file", "", "`file` holding the node token the control tier presents (at least 32 bytes; not readable by every user)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve the node API over HTTPS with this PEM certificate `file` (needs --tls-key)")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert")
	f.StringVar(&o.bundleDir, "bundle-dir", "", "`directory` every node mounts (NFS, CephFS, a ReadWriteMany volume) where a pause through the control tier writes the sandbox's bundle, so that another node resumes it if this one is lost (empty: paused sandboxes stay here)")
	f.DurationVar(&o.drain, "drain", 30*time.Second, "on SIGTERM/SIGINT, how long requests in flight may run before they are cut")
	return cmd
}

func (o *nodeOptions) validate() error {
	if err := cluster.ValidNodeName(o.name); err != nil {
		return fmt.Errorf("%w: --name: %v", errdefs.ErrInvalid, err)
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return fmt.Errorf("%w: --listen %q: %v", errdefs.ErrInvalid, o.listen, err)
	}
	if o.tokenFile == "" {
		return fmt.Errorf("%w: --node-token-file is required: the secret the control tier authenticates with", errdefs.ErrInvalid)
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return fmt.Errorf("%w: TLS needs both --tls-cert and --tls-key, or neither", errdefs.ErrInvalid)
	}
	if o.bundleDir != "" {
		if fi, err := os.Stat(o.bundleDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: --bundle-dir %q is not a directory", errdefs.ErrInvalid, o.bundleDir)
		}
	}
	if o.advertise != "" {
		u, err := url.Parse(o.advertise)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return fmt.Errorf("%w: --advertise %q: want a base URL such as https://node1.internal:7443", errdefs.ErrInvalid, o.advertise)
		}
		o.advertise = strings.TrimSuffix(o.advertise, "/")
	}
	return nil
}

// readNodeToken reads the node token file: a regular file no other user
// may read, at least api.MinNodeToken bytes once trimmed.
func readNodeToken(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--node-token-file: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o004 != 0 {
		return nil, fmt.Errorf("%w: --node-token-file %s: must be a regular file that not every user may read (chmod 0600)", errdefs.ErrInvalid, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--node-token-file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < api.MinNodeToken {
		return nil, fmt.Errorf("%w: --node-token-file %s: the token has %d bytes; at least %d (e.g. openssl rand -hex 32)", errdefs.ErrInvalid, path, len(b), api.MinNodeToken)
	}
	return b, nil
}

// kubeConfig is the Kubernetes client configuration: the kubeconfig file,
// else the pod's service account.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: no --kubeconfig (or KUBECONFIG) and not in a pod: %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: --kubeconfig %s: %w", path, err)
	}
	return c, nil
}

func runNode(cmd *cobra.Command, g *globals, m *sandbox.Manager, o *nodeOptions) error {
	ctx, cancel := context.WithCancelCause(cmd.Context())
	defer cancel(nil)
	token, err := readNodeToken(o.tokenFile)
	if err != nil {
		return err
	}
	kc, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kc.UserAgent = "airlock-node/" + version
	dyn, err := dynamic.NewForConfig(kc)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	var tlsConf *tls.Config
	if o.tlsCert != "" {
		if tlsConf, err = loadTLS(o.tlsCert, o.tlsKey, g.log); err != nil {
			return err
		}
	}
	setOOMScoreAdj(g.log, oomAdjServe)
	secret, err := m.Store.Secret(ctx, "secret.tokens")
	if err != nil {
		return err
	}
	if o.bundleDir != "" {
		m.Bundles = bundle.Dir{Root: o.bundleDir}
	}
	s, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Contexts: m, Ports: m, Snapshots: m, Volumes: m, Secrets: m, Templates: m, Browsers: m,
		Events: m.Store, Keys: m.Store, Log: g.log, Secret: secret, NodeToken: token, Mover: m})
	if err != nil {
		return err
	}
	// E2B's API, for the control tier to proxy: its control-plane routes
	// behind the node token like the rest, and the in-sandbox traffic
	// behind each sandbox's access token, as on a single host.
	if err := e2b.Register(s, e2b.Config{Sandboxes: m, Execs: s.Execs(), Files: m, Contexts: m, Snapshots: m, Secret: secret,
		Limiter: s.AllowTenant, Log: g.log}); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if tlsConf == nil && !isLoopback(ln.Addr()) {
		ln.Close()
		return fmt.Errorf("%w: the node API carries tenants' data and the node token: serve it over TLS (--tls-cert, --tls-key) or on loopback", errdefs.ErrInvalid)
	}
	advertise := o.advertise
	if advertise == "" {
		scheme := "http"
		if tlsConf != nil {
			scheme = "https"
		}
		// The address it listens on, or the host name if that is every
		// address.
		ta := ln.Addr().(*net.TCPAddr)
		host := ta.IP.String()
		if ta.IP.IsUnspecified() {
			host, _ = os.Hostname()
		}
		advertise = scheme + "://" + net.JoinHostPort(host, strconv.Itoa(ta.Port))
	}
	rt := m.Runtime
	// Warm pools: the namespace's SandboxWarmPools, reconciled onto this
	// node's manager, which keeps them filled.
	var runtimes []string
	if name, err := rt(ctx); err == nil {
		runtimes = []string{name}
	}
	go m.RunWarm(ctx)
	// Bundles of the sandboxes paused without one (an idle pause).
	go m.SweepBundles(ctx)
	ctl := cluster.NodeController{Config: kc, Namespace: o.namespace, Node: o.name, Runtimes: runtimes, Log: g.log}
	warmCtl := &cluster.WarmPools{NodeController: ctl, Target: nodeWarm{m}}
	go func() {
		if err := warmCtl.Run(ctx); err != nil && ctx.Err() == nil {
			g.log.Error("warm pools: the SandboxWarmPool controller stopped; this node keeps the pools it has", "err", err)
		}
	}()
	// Templates: the namespace's SandboxTemplates, built here for their
	// tenants.
	tplCtl := &cluster.Templates{NodeController: ctl, Target: newNodeTemplates(ctx, m, g.log)}
	go func() {
		if err := tplCtl.Run(ctx); err != nil && ctx.Err() == nil {
			g.log.Error("templates: the SandboxTemplate controller stopped; this node keeps the templates it has", "err", err)
		}
	}()
	reg := &cluster.Registrar{Dynamic: dyn, Namespace: o.namespace, Name: o.name, Log: g.log,
		Status: func(ctx context.Context) (cluster.Node, error) {
			n, err := nodeStatus(ctx, m, rt)
			n.Address = advertise
			return n, err
		}}
	regDone := make(chan error, 1)
	go func() {
		err := reg.Run(ctx)
		if err != nil {
			cancel(err) // a node that cannot register serves no one
		}
		regDone <- err
	}()
	err = serveAPI(ctx, s, ln, tlsConf, o.drain, nil, cmd.OutOrStdout(), g.log)
	cancel(nil)
	if rerr := <-regDone; rerr != nil {
		return rerr
	}
	return err
}

// nodeStatus is what this node publishes: the host's CPUs and memory, the
// runtime its sandboxes get, the guest kernel, and what its live
// sandboxes hold.
func nodeStatus(ctx context.Context, m *sandbox.Manager, rt func(context.Context) (string, error)) (cluster.Node, error) {
	n := cluster.Node{Arch: goruntime.GOARCH, Version: version, CPUs: goruntime.NumCPU(), MemoryMiB: memTotalMiB()}
	if name, err := rt(ctx); err == nil {
		n.Runtimes = []string{name}
	}
	if bc, err := (statedir.Layout{Root: m.L.Root}).LoadBootConfig(); err == nil {
		n.Kernel = bc.KernelRelease
	}
	sbs, err := m.Store.ListSandboxes(ctx)
	if err != nil {
		return n, err
	}
	for _, sb := range sbs {
		if sb.State.Alive() {
			n.Sandboxes++
			n.AllocatedCPUs += sb.CPUs
			n.AllocatedMemoryMiB += int64(sb.MemoryMiB)
		}
	}
	pools := m.WarmPoolsIn(sbs)
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		p := pools[name]
		i := slices.IndexFunc(n.Warm, func(w cluster.WarmReady) bool {
			return w.Image == p.Spec.Image && w.CPUs == p.Spec.CPUs && w.MemoryMiB == p.Spec.MemoryMiB
		})
		if i < 0 {
			n.Warm = append(n.Warm, cluster.WarmReady{Image: p.Spec.Image, CPUs: p.Spec.CPUs, MemoryMiB: p.Spec.MemoryMiB})
			i = len(n.Warm) - 1
		}
		n.Warm[i].Ready += p.Ready
	}
	return n, nil
}

// nodeWarm is the manager as the SandboxWarmPool controller's target: a
// pool's perNode is its size here.
type nodeWarm struct{ m *sandbox.Manager }

func (w nodeWarm) SetWarmPool(name string, s cluster.WarmPoolSpec) error {
	return w.m.SetWarmPool(name, sandbox.WarmPool{Image: s.Image, CPUs: s.CPUs, MemoryMiB: s.MemoryMiB, Size: s.PerNode})
}

func (w nodeWarm) DeleteWarmPool(name string) { w.m.DeleteWarmPool(name) }

func (w nodeWarm) WarmPoolState(name string) cluster.WarmPoolState {
	pools, err := w.m.WarmPools(context.Background())
	if err != nil {
		return cluster.WarmPoolState{Error: err.Error()}
	}
	p := pools[name]
	return cluster.WarmPoolState{Ready: p.Ready, Size: p.Spec.Size, Error: p.Err}
}

// memTotalMiB is the host's memory (MemTotal of /proc/meminfo).
func memTotalMiB() int64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	mi, err := fs.Meminfo()
	if err != nil || mi.MemTotal == nil {
		return 0
	}
	return int64(*mi.MemTotal / 1024)
}

// nodeTemplates is the manager as the SandboxTemplate controller's
// target: each template is built in the background for its tenant, one
// build per template at a time (a new spec cancels the build of the old).
type nodeTemplates struct {
	ctx context.Context
	m   *sandbox.Manager
	log *slog.Logger

	mu     sync.Mutex
	builds map[string]*nodeBuild
}

type nodeBuild struct {
	spec   cluster.TemplateSpec
	state  cluster.TemplateState
	cancel context.CancelFunc
	done   chan struct{}
}

func newNodeTemplates(ctx context.Context, m *sandbox.Manager, log *slog.Logger) *nodeTemplates {
	return &nodeTemplates{ctx: ctx, m: m, log: log, builds: map[string]*nodeBuild{}}
}

func (t *nodeTemplates) SetTemplate(name string, spec cluster.TemplateSpec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b, ok := t.builds[name]; ok {
		if reflect.DeepEqual(b.spec, spec) {
			return
		}
		b.cancel()
	}
	ctx, cancel := context.WithCancel(t.ctx)
	b := &nodeBuild{spec: spec, state: cluster.TemplateState{Phase: cluster.TemplateBuilding}, cancel: cancel, done: make(chan struct{})}
	t.builds[name] = b
	go func() {
		defer close(b.done)
		t0 := time.Now()
		// An empty build context: COPY and ADD find nothing to copy.
		bctx, err := os.MkdirTemp("", "airlock-template-context-")
		if err == nil {
			defer os.RemoveAll(bctx)
			_, err = t.m.BuildTemplate(ctx, sandbox.Caller{Tenant: spec.Tenant, Via: "kubernetes"}, sandbox.BuildOptions{
				Name: name, Dockerfile: []byte(spec.Dockerfile), Context: bctx, BuildArgs: spec.BuildArgs, Start: spec.Start, Ready: spec.Ready,
				CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB, DiskMiB: spec.DiskMiB,
			})
		}
		st := cluster.TemplateState{Phase: cluster.TemplateReady}
		if err != nil {
			st = cluster.TemplateState{Phase: cluster.TemplateFailed, Error: err.Error()}
			t.log.Warn("templates: build failed", "template", name, "tenant", spec.Tenant, "err", err)
		} else {
			t.log.Info("templates: built", "template", name, "tenant", spec.Tenant, "took", time.Since(t0).Round(time.Millisecond))
		}
		t.mu.Lock()
		if t.builds[name] == b {
			b.state = st
		}
		t.mu.Unlock()
	}()
}

func (t *nodeTemplates) DeleteTemplate(name string) {
	t.mu.Lock()
	b, ok := t.builds[name]
	delete(t.builds, name)
	t.mu.Unlock()
	if !ok {
		return // never built here since this node started
	}
	b.cancel()
	<-b.done
	err := t.m.RemoveTemplate(t.ctx, sandbox.Caller{Tenant: b.spec.Tenant, Via: "kubernetes"}, name)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.log.Warn("templates: remove", "template", name, "tenant", b.spec.Tenant, "err", err)
	}
}

func (t *nodeTemplates) TemplateState(name string) cluster.TemplateState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b, ok := t.builds[name]; ok {
		return b.state
	}
	return cluster.TemplateState{}
}
