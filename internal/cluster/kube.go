package cluster

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The Kubernetes objects of a cluster (deploy/kubernetes has their
// definitions and the rights each identity has on them).
var (
	// NodeResource is the AirlockNode custom resource.
	NodeResource = schema.GroupVersionResource{Group: "airlock.dev", Version: "v1alpha1", Resource: "airlocknodes"}
	nodeKind     = schema.GroupVersionKind{Group: "airlock.dev", Version: "v1alpha1", Kind: "AirlockNode"}
)

const (
	// DefaultNamespace holds the Leases and AirlockNodes.
	DefaultNamespace = "airlock"
	// leasePrefix names a node's Lease: node-<name>.
	leasePrefix = "node-"
	// componentLabel marks the Leases of airlock nodes (value "node").
	componentLabel = "airlock.dev/component"
	// DefaultLeaseDuration: a node that has not renewed its Lease for
	// this long is lost. Nodes renew three times per duration.
	DefaultLeaseDuration = 10 * time.Second
)

// nodeName is what a node may be called: a DNS label (it names Kubernetes
// objects), at most 58 characters so that "node-" + name is one too.
var nodeName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,56}[a-z0-9])?$`) })

// ValidNodeName reports why name cannot name a node, or nil.
func ValidNodeName(name string) error {
	if !nodeName().MatchString(name) {
		return fmt.Errorf("node name %q: lower-case letters, digits and '-', starting and ending with a letter or digit, at most 58 characters", name)
	}
	return nil
}

// nodeSpec and nodeStatus are an AirlockNode's spec and status.
type nodeSpec struct {
	Address  string `json:"address"`
	Draining bool   `json:"draining,omitempty"`
}

type nodeStatus struct {
	Runtimes           []string    `json:"runtimes,omitempty"`
	Arch               string      `json:"arch,omitempty"`
	Accel              string      `json:"accel,omitempty"`
	Kernel             string      `json:"kernel,omitempty"`
	Version            string      `json:"version,omitempty"`
	CPUs               int         `json:"cpus"`
	MemoryMiB          int64       `json:"memoryMiB"`
	AllocatedCPUs      int         `json:"allocatedCPUs"`
	AllocatedMemoryMiB int64       `json:"allocatedMemoryMiB"`
	Sandboxes          int         `json:"sandboxes"`
	Warm               []WarmReady `json:"warm,omitempty"`
	Updated            string      `json:"updated,omitempty"`
	// Holder is the Lease holder identity of the process that wrote this
	// status: a node that restarts holds a new Lease before it publishes,
	// and until it does, the status (its address above all) is the last
	// run's.
	Holder string `json:"holder,omitempty"`
}

func statusOf(n Node) nodeStatus {
	return nodeStatus{
		Runtimes: n.Runtimes, Arch: n.Arch, Accel: n.Accel, Kernel: n.Kernel, Version: n.Version,
		CPUs: n.CPUs, MemoryMiB: n.MemoryMiB, AllocatedCPUs: n.AllocatedCPUs, AllocatedMemoryMiB: n.AllocatedMemoryMiB,
		Sandboxes: n.Sandboxes, Warm: n.Warm,
	}
}

// nodeObject is n as an AirlockNode, written by the Lease holder holder.
func nodeObject(namespace string, n Node, holder string) (*unstructured.Unstructured, error) {
	spec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&nodeSpec{Address: n.Address, Draining: n.Draining})
	if err != nil {
		return nil, err
	}
	st := statusOf(n)
	st.Updated, st.Holder = time.Now().UTC().Format(time.RFC3339), holder
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec, "status": status}}
	u.SetGroupVersionKind(nodeKind)
	u.SetNamespace(namespace)
	u.SetName(n.Name)
	return u, nil
}

// nodeFromObject reads what an AirlockNode says of its node (Live and
// the Lease's fields are the Registry's), and whether it has a status
// yet (a node creates its object and then writes the status, a second
// call) and which Lease holder wrote it.
func nodeFromObject(u *unstructured.Unstructured) (n Node, published bool, holder string, err error) {
	var spec nodeSpec
	var st nodeStatus
	if m, ok := u.Object["spec"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &spec); err != nil {
			return Node{}, false, "", fmt.Errorf("airlocknode %s: spec: %w", u.GetName(), err)
		}
	}
	if m, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st); err != nil {
			return Node{}, false, "", fmt.Errorf("airlocknode %s: status: %w", u.GetName(), err)
		}
	}
	return Node{
		Name: u.GetName(), Address: spec.Address, Draining: spec.Draining,
		Runtimes: st.Runtimes, Arch: st.Arch, Accel: st.Accel, Kernel: st.Kernel, Version: st.Version,
		CPUs: st.CPUs, MemoryMiB: st.MemoryMiB, AllocatedCPUs: st.AllocatedCPUs, AllocatedMemoryMiB: st.AllocatedMemoryMiB,
		Sandboxes: st.Sandboxes, Warm: st.Warm,
	}, st.Updated != "", st.Holder, nil
}

// leaseResource is coordination.k8s.io's Lease.
var (
	leaseResource = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	leaseKind     = schema.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"}
)

// leaseClient is the typed Lease calls the registrar makes, over the
// dynamic client.
type leaseClient struct{ ri dynamic.ResourceInterface }

func (c leaseClient) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	u, err := c.ri.Get(ctx, name, o)
	if err != nil {
		return nil, err
	}
	return leaseFrom(u)
}

func (c leaseClient) Create(ctx context.Context, l *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	return writeLease(l, func(u *unstructured.Unstructured) (*unstructured.Unstructured, error) { return c.ri.Create(ctx, u, o) })
}

func (c leaseClient) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	return writeLease(l, func(u *unstructured.Unstructured) (*unstructured.Unstructured, error) { return c.ri.Update(ctx, u, o) })
}

// writeLease sends l through write and returns what the server stored.
func writeLease(l *coordinationv1.Lease, write func(*unstructured.Unstructured) (*unstructured.Unstructured, error)) (*coordinationv1.Lease, error) {
	u, err := leaseObject(l)
	if err != nil {
		return nil, err
	}
	if u, err = write(u); err != nil {
		return nil, err
	}
	return leaseFrom(u)
}

func (c leaseClient) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	return c.ri.Delete(ctx, name, o)
}

func leaseObject(l *coordinationv1.Lease) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(leaseKind)
	return u, nil
}

func leaseFrom(u *unstructured.Unstructured) (*coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &l); err != nil {
		return nil, fmt.Errorf("lease %s: %w", u.GetName(), err)
	}
	return &l, nil
}
