package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/control"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// clusterOptions are serve's settings as a cluster's control tier.
type clusterOptions struct {
	enabled       bool
	catalog       string
	kubeconfig    string
	namespace     string
	nodeTokenFile string
	nodeCA        string
}

func (c *clusterOptions) flags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&c.enabled, "cluster", false, "serve as a replica of a cluster's control tier: place sandboxes on the airlock nodes that Kubernetes lists and proxy their API (see the README's Cluster section)")
	f.StringVar(&c.catalog, "catalog", os.Getenv("AIRLOCK_CATALOG"), "with --cluster: the cluster's catalog, a postgres:// `URL` every replica shares (env AIRLOCK_CATALOG)")
	f.StringVar(&c.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "with --cluster: kubeconfig `file` (env KUBECONFIG; empty: the pod's service account)")
	f.StringVar(&c.namespace, "namespace", cluster.DefaultNamespace, "with --cluster: the nodes' namespace")
	f.StringVar(&c.nodeTokenFile, "node-token-file", "", "with --cluster: `file` holding the token the nodes accept (as given to airlock node)")
	f.StringVar(&c.nodeCA, "node-ca", "", "with --cluster: PEM `file` of the CA certificates the nodes' TLS certificates chain to (default: the system's)")
}

// runControl serves the control tier until ctx ends.
func runControl(cmd *cobra.Command, g *globals, o *serveOptions) error {
	c := &o.cluster
	if !store.IsPostgresURL(c.catalog) {
		return fmt.Errorf("%w: --cluster needs --catalog postgres://... (the catalog every replica shares)", errdefs.ErrInvalid)
	}
	ctx := cmd.Context()
	token, err := readNodeToken(c.nodeTokenFile)
	if err != nil {
		return err
	}
	st, err := store.OpenPostgres(ctx, c.catalog)
	if err != nil {
		return err
	}
	defer st.Close()
	kc, err := kubeConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	kc.UserAgent = "airlock-control/" + version
	dyn, err := dynamic.NewForConfig(kc)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true}
	if c.nodeCA != "" {
		pem, err := os.ReadFile(c.nodeCA)
		if err != nil {
			return fmt.Errorf("--node-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%w: --node-ca %s holds no PEM certificate", errdefs.ErrInvalid, c.nodeCA)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	reg := &cluster.Registry{Dynamic: dyn, Namespace: c.namespace, Log: g.log}
	srv, err := control.New(control.Config{Store: st, Nodes: reg, NodeToken: token, Transport: tr, Templates: reg.TemplateNodes, Log: g.log})
	if err != nil {
		return err
	}
	reg.OnLost, reg.OnLive = srv.OnNodeLost, srv.OnNodeLive
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(rctx) }()
	go srv.RunBundleSync(rctx)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	err = reg.WaitSynced(wctx)
	wcancel()
	if err != nil {
		return fmt.Errorf("kubernetes: the nodes' Leases and AirlockNodes could not be listed within a minute: %w", err)
	}
	var tlsConf *tls.Config
	if o.tlsCert != "" {
		if tlsConf, err = loadTLS(o.tlsCert, o.tlsKey, g.log); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	warnPlainHTTP(g.log, ln.Addr(), tlsConf)
	hs := &http.Server{Handler: srv, TLSConfig: tlsConf, ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() {
		if tlsConf != nil {
			errc <- hs.ServeTLS(ln, "", "")
			return
		}
		errc <- hs.Serve(ln)
	}()
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
	}
	fmt.Fprintf(cmd.OutOrStdout(), "airlock control tier listening on %s://%s\n", scheme, ln.Addr())
	g.log.Info("serving the control tier", "addr", ln.Addr().String(), "nodes", len(reg.Nodes()))
	select {
	case err := <-errc:
		return err
	case err := <-regDone:
		return fmt.Errorf("kubernetes: the node registry stopped: %w", err)
	case <-ctx.Done():
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.drain)
	defer cancel()
	err = hs.Shutdown(dctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
