package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TemplateResource is the SandboxTemplate custom resource: a template of
// one tenant, from a Dockerfile, that every node builds, so that the
// tenant's creates of that name work on whichever node they are placed.
var TemplateResource = schema.GroupVersionResource{Group: "airlock.dev", Version: "v1alpha1", Resource: "sandboxtemplates"}

// TemplateSpec is a SandboxTemplate's spec; the template's name is the
// object's.
type TemplateSpec struct {
	Tenant     string            `json:"tenant"`
	Dockerfile string            `json:"dockerfile"`
	BuildArgs  map[string]string `json:"buildArgs,omitempty"`
	// Start and Ready are the template's start command and ready check
	// (airlock template build --start, --ready).
	Start     string `json:"start,omitempty"`
	Ready     string `json:"ready,omitempty"`
	CPUs      int    `json:"cpus,omitempty"`
	MemoryMiB int    `json:"memoryMiB,omitempty"`
	DiskMiB   int    `json:"diskMiB,omitempty"`
	// Runtime, if set ("qemu" or "gvisor"), limits the template to nodes
	// that run it; the others build nothing.
	Runtime string `json:"runtime,omitempty"`
}

// Template build phases, as a node reports them.
const (
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
)

// TemplateState is one node's build of a template: its phase ("" when
// the node builds none), and why it failed.
type TemplateState struct {
	Phase string
	Error string
}

// TemplateTarget is a node's templates (the sandbox manager, adapted by
// the command). Templates calls it from one goroutine.
type TemplateTarget interface {
	// SetTemplate builds template name from spec in the background,
	// unless the spec is the one it last built or is building.
	SetTemplate(name string, spec TemplateSpec)
	// DeleteTemplate stops a build of template name and removes it.
	DeleteTemplate(name string)
	// TemplateState reports template name on this node.
	TemplateState(name string) TemplateState
}

// Templates reconciles the namespace's SandboxTemplates onto one node's
// Target.
type Templates struct {
	NodeController
	Target TemplateTarget
}

const (
	// templateBuilding is how often a build in progress is looked at
	// again: that is how its end reaches the status.
	templateBuilding = 3 * time.Second
	// maxDockerfile bounds a SandboxTemplate's Dockerfile (the API
	// server's object limit is about 1.5 MB).
	maxDockerfile = 256 << 10
)

// Run reconciles until ctx ends.
func (t *Templates) Run(ctx context.Context) error {
	if t.Target == nil {
		return errors.New("templates: no Target")
	}
	log := cmp.Or(t.Log, slog.Default())
	return t.controller("templates", TemplateResource, func(_ context.Context, name string, obj map[string]any, deleted bool) (nodeEntry, time.Duration) {
		if deleted {
			t.Target.DeleteTemplate(name)
			return nil, 0
		}
		spec, err := templateSpecFrom(name, obj)
		switch {
		case err != nil:
			log.Warn("template refused", "template", name, "err", err)
			t.Target.DeleteTemplate(name)
			return nodeEntry{"phase": TemplateFailed, "error": oneLine(err.Error())}, 0
		case spec.Runtime != "" && !slices.Contains(t.Runtimes, spec.Runtime):
			t.Target.DeleteTemplate(name)
			return nodeEntry{"phase": "", "error": ""}, 0
		}
		t.Target.SetTemplate(name, spec)
		st := t.Target.TemplateState(name)
		e := nodeEntry{"phase": st.Phase, "error": oneLine(st.Error)}
		if st.Phase == TemplateBuilding {
			return e, templateBuilding
		}
		return e, statusEvery
	}).run(ctx)
}

var (
	templateName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })
	tenantName   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`) })
)

// templateSpecFrom decodes and checks SandboxTemplate name's spec (the
// CRD's schema checks the same; this is for an object written around it).
func templateSpecFrom(name string, obj map[string]any) (TemplateSpec, error) {
	var s TemplateSpec
	if obj == nil {
		return s, errors.New("no spec")
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &s); err != nil {
		return s, fmt.Errorf("spec: %w", err)
	}
	switch {
	case !templateName().MatchString(name):
		return s, fmt.Errorf("name %q: a template's name is 1-64 characters a-z 0-9 . _ - starting with a letter or digit", name)
	case !tenantName().MatchString(s.Tenant):
		return s, fmt.Errorf("spec.tenant %q: lower-case letters, digits, '_' and '-', at most 63", s.Tenant)
	case s.Dockerfile == "" || len(s.Dockerfile) > maxDockerfile:
		return s, fmt.Errorf("spec.dockerfile: between 1 byte and %d KiB", maxDockerfile>>10)
	case s.Runtime != "" && s.Runtime != "qemu" && s.Runtime != "gvisor":
		return s, fmt.Errorf("spec.runtime %q: want qemu, gvisor or none", s.Runtime)
	case s.CPUs < 0 || s.MemoryMiB < 0 || s.DiskMiB < 0:
		return s, errors.New("spec: cpus, memoryMiB and diskMiB must not be negative")
	}
	return s, nil
}
