// Package shimconf is the configuration document the control plane gives a
// shim it starts (`airlock shim`): one versioned JSON object on a pipe
// (descriptor FD), read once, strictly, before the shim does anything.
//
// It carries every setting of the shim: the sandbox, its runtime and the
// host settings of the process that started it (acceleration, log level,
// host cgroups, disk reserve, the DNS and upstream CA overrides, the dial
// map test hook) and the values of the sandbox's secrets. Secret values
// reach the shim only here: never argv, the environment or a file. The
// shim's readiness pipe (descriptor 3) and its shim lock
// (sandbox.ShimLockFD) stay descriptors of their own: they are kernel
// objects, not settings.
//
// The environment knobs among these settings (internal/envknob) are read by
// the command that builds the sandbox.Manager (cmd/airlock,
// cmd/airlock-bench) and passed in sandbox.Manager.Shim; the shim itself
// reads no environment knob.
package shimconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// Version is the document version this package writes and reads. A shim
// refuses any other: the control plane and the shim are one binary, so a
// mismatch means a binary was replaced under a running control plane.
const Version = 1

// FD is the descriptor a shim reads its document on (0-2 are stdio, 3 the
// readiness pipe, 5 the shim lock).
const FD = 4

// MaxSize bounds the document: room for the largest secrets allowed
// (netconf.MaxSecrets values of netconf.MaxSecretLen bytes, each byte
// escaped to six at worst: 3 MiB) and the settings.
const MaxSize = 4 << 20

// Options are the settings every shim a control plane starts shares: its
// command's flags and environment knobs. The zero value is the defaults
// (see WithDefaults).
type Options struct {
	// Accel is the acceleration: auto, kvm or tcg ("" is auto).
	Accel string `json:"accel"`
	// LogLevel is the shim log's level: debug, info, warn or error (""
	// is info).
	LogLevel string `json:"log_level"`
	// HostCgroups is auto, on or off ("" is auto): whether the shim puts
	// the sandbox's VMM or sentry and itself in a host cgroup with memory
	// and pids limits from its size (on: refuse to start without).
	HostCgroups string `json:"host_cgroups"`
	// DNS lists the resolvers ("ip[:port],...") guest DNS queries are
	// forwarded to; "" means the nameservers of /etc/resolv.conf
	// (envknob.DNS).
	DNS string `json:"dns,omitempty"`
	// UpstreamCAFile is a PEM file of extra CAs trusted for the upstreams
	// of intercepted connections (envknob.UpstreamCAFile).
	UpstreamCAFile string `json:"upstream_ca_file,omitempty"`
	// TestDialMap is a TEST HOOK ("a.b.c.d=w.x.y.z,..."): where the policy
	// allowed a flow to a.b.c.d the shim dials w.x.y.z instead
	// (envknob.TestDialMap). Set only by tests and the benchmarks.
	TestDialMap string `json:"test_dial_map,omitempty"`
	// ProcAudit is on or off ("" is on): whether the shim records the
	// programs the guest runs in the audit trail (envknob.ProcAudit).
	ProcAudit string `json:"proc_audit,omitempty"`
}

// WithDefaults returns o with its empty fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Accel == "" {
		o.Accel = "auto"
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.HostCgroups == "" {
		o.HostCgroups = "auto"
	}
	return o
}

// Doc is one shim's configuration document.
type Doc struct {
	// Version is Version.
	Version int `json:"version"`
	// StateDir is the absolute path of the state directory.
	StateDir string `json:"state_dir"`
	// ID is the sandbox the shim runs.
	ID string `json:"id"`
	// Runtime runs the sandbox: qemu or gvisor.
	Runtime string `json:"runtime"`
	// DiskReserve is the state dir's free-space reserve in bytes, as
	// sandbox.Manager.DiskReserve (0: the default; negative: none).
	DiskReserve int64 `json:"disk_reserve"`
	Options
	// Secrets are the values of the sandbox's secrets, by name.
	Secrets netconf.Values `json:"secrets,omitempty"`
	// BuildRoot, for a gvisor template build's step sandbox, is the
	// absolute path of the host overlay mount the control plane made for
	// it: the sandbox's root, written in place (runtime.Spec.RootInPlace).
	BuildRoot string `json:"build_root,omitempty"`
}

// Validate checks d and returns an errdefs.ErrInvalid error that names the
// first bad field. It never quotes a secret value. The sandbox id's format
// is the shim's to check (sandbox.ValidateID); Validate requires one.
func (d Doc) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: shim config: "+format, append([]any{errdefs.ErrInvalid}, a...)...)
	}
	var lvl slog.Level
	switch {
	case d.Version != Version:
		return bad("version %d, this shim reads version %d", d.Version, Version)
	case d.ID == "":
		return bad("no sandbox id")
	case d.StateDir == "" || !filepath.IsAbs(d.StateDir):
		return bad("state_dir %q is not an absolute path", d.StateDir)
	case d.Runtime != "qemu" && d.Runtime != "gvisor":
		return bad("runtime %q: want qemu or gvisor", d.Runtime)
	case d.Accel != "auto" && d.Accel != "kvm" && d.Accel != "tcg":
		return bad("accel %q: want auto, kvm or tcg", d.Accel)
	case lvl.UnmarshalText([]byte(d.LogLevel)) != nil:
		return bad("log_level %q: want debug, info, warn or error", d.LogLevel)
	case d.HostCgroups != "auto" && d.HostCgroups != "on" && d.HostCgroups != "off":
		return bad("host_cgroups %q: want auto, on or off", d.HostCgroups)
	case d.ProcAudit != "" && d.ProcAudit != "on" && d.ProcAudit != "off":
		return bad("proc_audit %q: want on or off", d.ProcAudit)
	case len(d.Secrets) > netconf.MaxSecrets:
		return bad("%d secrets (at most %d)", len(d.Secrets), netconf.MaxSecrets)
	case d.BuildRoot != "" && (d.Runtime != "gvisor" || !filepath.IsAbs(d.BuildRoot)):
		return bad("build_root %q: an absolute path, for the gvisor runtime only", d.BuildRoot)
	}
	for name, v := range d.Secrets {
		if name == "" {
			return bad("a secret without a name")
		}
		if len(v) > netconf.MaxSecretLen {
			return bad("secret %q: its value is longer than %d bytes", name, netconf.MaxSecretLen)
		}
	}
	return nil
}

// Write validates d and writes it to w as one JSON document.
func Write(w io.Writer, d Doc) error {
	if err := d.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("shim config: %w", err)
	}
	if len(b) > MaxSize {
		return fmt.Errorf("%w: shim config: %d bytes (at most %d)", errdefs.ErrInvalid, len(b), MaxSize)
	}
	_, err = w.Write(b)
	return err
}

// Read reads one document from r up to its end (at most MaxSize bytes),
// refusing unknown fields and trailing data, and validates it. Its errors
// wrap errdefs.ErrInvalid (or are r's) and never quote a secret value.
func Read(r io.Reader) (Doc, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return Doc{}, fmt.Errorf("read shim config: %w", err)
	}
	if len(b) > MaxSize {
		return Doc{}, fmt.Errorf("%w: shim config: more than %d bytes", errdefs.ErrInvalid, MaxSize)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return Doc{}, fmt.Errorf("%w: shim config: empty (the shim is started by airlock itself, with its config on descriptor %d)", errdefs.ErrInvalid, FD)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d Doc
	if err := dec.Decode(&d); err != nil {
		return Doc{}, fmt.Errorf("%w: shim config: %s", errdefs.ErrInvalid, decodeError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Doc{}, fmt.Errorf("%w: shim config: data after the document", errdefs.ErrInvalid)
	}
	if err := d.Validate(); err != nil {
		return Doc{}, err
	}
	return d, nil
}

// decodeError describes a decoding error without the document's bytes:
// encoding/json's errors name fields, types and offsets, never values,
// but a syntax error is reduced to its offset to be sure.
func decodeError(err error) string {
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Sprintf("not JSON (at byte %d)", se.Offset)
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("field %q: a JSON %s, want %s", te.Field, te.Value, te.Type)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated"
	}
	return err.Error() // unknown field "x"
}
