package agent

import (
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/cgroup"
	"github.com/airlock-sandbox/airlock/internal/agent/reaper"
	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

// Options configures a Server.
type Options struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// Version is reported by Info (default "dev").
	Version string
	// Reaper reaps the processes of ExecService. Required.
	Reaper *reaper.Reaper
	// Cgroups places each exec in its own cgroup. Nil: no cgroups, and a
	// timeout or cancellation kills the exec's process group.
	Cgroups *cgroup.Manager
	// DefaultPidsLimit applies to execs that set none (default 1024). Only
	// enforced with Cgroups.
	DefaultPidsLimit uint32
	// PasswdFile and GroupFile resolve users (default /etc/passwd and
	// /etc/group).
	PasswdFile, GroupFile string
	// Guest means the agent is the guest's PID 1: Sync sets the clock, RNG
	// and hostname, Shutdown powers off, and children are started with
	// oom_score_adj 0. Without it Sync only validates and Shutdown is a no-op.
	Guest bool
	// RootDevice is the root block device, for Sync's grow_root ("" when
	// running from the initramfs).
	RootDevice string
	// DrainGrace is how long an exec's pipes are drained after its process
	// exits (default 100ms).
	DrainGrace time.Duration

	// system replaces the machine actions (tests).
	system system
	// interpreters overrides the programs of code contexts (tests).
	interpreters interpreters
	// parkExpiry overrides how long a parked exec waits to be adopted
	// (tests).
	parkExpiry time.Duration
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.DefaultPidsLimit == 0 {
		o.DefaultPidsLimit = 1024
	}
	if o.PasswdFile == "" {
		o.PasswdFile = "/etc/passwd"
	}
	if o.GroupFile == "" {
		o.GroupFile = "/etc/group"
	}
	if o.DrainGrace <= 0 {
		o.DrainGrace = 100 * time.Millisecond
	}
}

// Validate reports a missing required option.
func (o *Options) Validate() error {
	if o.Reaper == nil {
		return errors.New("agent: Options.Reaper is required")
	}
	return nil
}

// Server holds the guest services. Safe for concurrent use.
type Server struct {
	handler  http.Handler
	contexts *contextService
	parked   *parkTable
	wg       sync.WaitGroup
}

// NewServer builds the services.
func NewServer(opts Options) (*Server, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	sys := opts.system
	if sys == nil {
		if opts.Guest {
			sys = guestSystem{log: opts.Logger, rootDevice: opts.RootDevice}
		} else {
			sys = hostSystem{log: opts.Logger}
		}
	}
	s := &Server{}
	s.parked = newParkTable(opts.parkExpiry, &s.wg)
	users := userDB{passwd: opts.PasswdFile, group: opts.GroupFile}
	s.contexts = newContextService(opts.Logger, opts.Reaper, opts.Cgroups, users, opts.DefaultPidsLimit, opts.Guest, opts.interpreters)
	mux := agentapi.NewHandler(
		&agentService{
			log:           opts.Logger,
			version:       opts.Version,
			sys:           sys,
			powerOffDelay: 100 * time.Millisecond,
			wg:            &s.wg,
		},
		&execService{
			log:    opts.Logger,
			reaper: opts.Reaper,
			cg:     opts.Cgroups,
			users:  users,
			pids:   opts.DefaultPidsLimit,
			guest:  opts.Guest,
			grace:  opts.DrainGrace,
			wg:     &s.wg,
			parked: s.parked,
		},
		&fileService{log: opts.Logger, users: users},
	)
	mux.Handle(agentv1connect.NewContextServiceHandler(s.contexts))
	s.handler = identityOnly(mux)
	return s, nil
}

// identityOnly keeps connect from compressing responses: it drops the
// headers in which the client offers encodings. By default connect clients
// offer gzip, and gzip of file data and exec output under TCG ran at about
// 10 MB/s, a tenth of what the channel carries. The virtio channel needs no
// compression, and the host then never inflates guest data.
func identityOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Accept-Encoding")
		r.Header.Del("Connect-Accept-Encoding")
		r.Header.Del("Grpc-Accept-Encoding")
		h.ServeHTTP(w, r)
	})
}

// Handler serves the four services; pass it to agentapi.Serve.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the code contexts' interpreters and waits for the goroutines
// the services left behind (request readers of finished execs, a pending
// power-off). Call it after every session using the handler has ended.
func (s *Server) Close() {
	s.contexts.close()
	s.parked.close()
	s.wg.Wait()
}
