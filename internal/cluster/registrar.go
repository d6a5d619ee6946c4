package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

// Registrar keeps one node registered: its Lease renewed (three times per
// LeaseDuration) and its AirlockNode's status current (on change, and at
// least every statusEvery). Two processes cannot hold one node name: the
// second is refused while the first's Lease is fresh.
type Registrar struct {
	// Dynamic is the Kubernetes client (the dynamic one only: the typed
	// clientset would link every API group's types into airlock).
	Dynamic   dynamic.Interface
	Namespace string // DefaultNamespace if empty
	Name      string
	// LeaseDuration: DefaultLeaseDuration if zero.
	LeaseDuration time.Duration
	// Status reports the node as it is now: its address and capacity
	// (Name, Live and the Lease fields are ignored).
	Status func(context.Context) (Node, error)
	Log    *slog.Logger
}

// statusEvery bounds how stale an unchanged status may get.
const statusEvery = time.Minute

// Run registers the node and keeps it registered until ctx ends; then it
// deletes the Lease, so the control tier sees the node gone at once. It
// returns an error if the name is another process's, or if another
// process takes the Lease over.
func (r *Registrar) Run(ctx context.Context) error {
	if err := ValidNodeName(r.Name); err != nil {
		return err
	}
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	if r.LeaseDuration <= 0 {
		r.LeaseDuration = DefaultLeaseDuration
	}
	if r.Log == nil {
		r.Log = slog.Default()
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	identity := r.Name + "/" + hex.EncodeToString(b)
	leases := leaseClient{r.Dynamic.Resource(leaseResource).Namespace(r.Namespace)}
	lease, err := r.acquire(ctx, identity)
	if err != nil {
		return err
	}
	r.Log.Info("node registered", "node", r.Name, "namespace", r.Namespace, "lease_duration", r.LeaseDuration)
	defer func() {
		// A clean stop: the Lease goes, so the node is gone at once
		// rather than when the Lease runs out.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err := leases.Delete(dctx, lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &lease.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			r.Log.Warn("node: deleting its Lease", "err", err)
		}
	}()
	var published nodeStatus
	var publishedAt time.Time
	publish := func() {
		n, err := r.Status(ctx)
		if err != nil {
			r.Log.Warn("node: status", "err", err)
			return
		}
		n.Name = r.Name
		if reflect.DeepEqual(statusOf(n), published) && time.Since(publishedAt) < statusEvery {
			return
		}
		if err := r.publish(ctx, n, identity); err != nil {
			if ctx.Err() == nil {
				r.Log.Warn("node: publishing its AirlockNode", "err", err)
			}
			return
		}
		published, publishedAt = statusOf(n), time.Now()
	}
	publish()
	tick := time.NewTicker(r.LeaseDuration / 3)
	defer tick.Stop()
	lastRenew := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
		switch {
		case err == nil:
			lease, lastRenew = updated, time.Now()
		case ctx.Err() != nil:
			return nil
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// Someone else wrote it: ours still, or taken over?
			cur, gerr := leases.Get(ctx, lease.Name, metav1.GetOptions{})
			if gerr == nil && ptr.Deref(cur.Spec.HolderIdentity, "") == identity {
				lease = cur
				continue
			}
			return fmt.Errorf("node %s: its Lease was taken over by another process (%s)", r.Name, holderOf(cur, gerr))
		default:
			if since := time.Since(lastRenew); since > r.LeaseDuration {
				r.Log.Error("node: cannot renew its Lease; the control tier now counts this node as lost", "err", err, "since", since.Round(time.Second))
			} else {
				r.Log.Warn("node: renewing its Lease", "err", err)
			}
			continue
		}
		publish()
	}
}

func holderOf(l *coordinationv1.Lease, err error) string {
	if err != nil {
		return err.Error()
	}
	return "holder " + ptr.Deref(l.Spec.HolderIdentity, "(none)")
}

// acquire creates the node's Lease, or takes over one whose holder
// stopped renewing it.
func (r *Registrar) acquire(ctx context.Context, identity string) (*coordinationv1.Lease, error) {
	leases := leaseClient{r.Dynamic.Resource(leaseResource).Namespace(r.Namespace)}
	now := metav1.MicroTime{Time: time.Now()}
	want := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: leasePrefix + r.Name, Namespace: r.Namespace, Labels: map[string]string{componentLabel: "node"}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &identity,
			LeaseDurationSeconds: ptr.To(int32(max(r.LeaseDuration/time.Second, 1))),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	for range 3 {
		l, err := leases.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return l, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("node %s: creating its Lease in namespace %s: %w", r.Name, r.Namespace, err)
		}
		cur, err := leases.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: reading its Lease: %w", r.Name, err)
		}
		if fresh, age := leaseFresh(cur, time.Now()); fresh {
			return nil, fmt.Errorf("node name %s is taken: its Lease was renewed %s ago by %s; stop that node first, or pick another --name",
				r.Name, age.Round(time.Millisecond), ptr.Deref(cur.Spec.HolderIdentity, "(none)"))
		}
		cur.Spec = want.Spec
		cur.Labels = want.Labels
		l, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			return l, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("node %s: taking over its stale Lease: %w", r.Name, err)
		}
	}
	return nil, errors.New("node " + r.Name + ": its Lease keeps changing under it; is another node starting with this name?")
}

// leaseFresh reports whether l's holder renewed it within its duration
// (by this host's clock: a takeover needs the old holder's silence to be
// longer than a duration here, so clock skew only delays it).
func leaseFresh(l *coordinationv1.Lease, now time.Time) (bool, time.Duration) {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		return false, 0
	}
	age := now.Sub(l.Spec.RenewTime.Time)
	d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	return age < d, age
}

// publish writes n as the node's AirlockNode, as Lease holder holder:
// created, or its spec and status updated.
func (r *Registrar) publish(ctx context.Context, n Node, holder string) error {
	obj, err := nodeObject(r.Namespace, n, holder)
	if err != nil {
		return err
	}
	nodes := r.Dynamic.Resource(NodeResource).Namespace(r.Namespace)
	cur, err := nodes.Get(ctx, n.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		created, err := nodes.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create airlocknode %s: %w", n.Name, err)
		}
		cur = created
	case err != nil:
		return fmt.Errorf("get airlocknode %s: %w", n.Name, err)
	default:
		// The spec's address is the node's; draining is an operator's
		// (kubectl patch), so it is kept.
		spec, _ := cur.Object["spec"].(map[string]any)
		if spec == nil || spec["address"] != n.Address {
			if spec == nil {
				spec = map[string]any{}
			}
			spec["address"] = n.Address
			cur.Object["spec"] = spec
			if cur, err = nodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update airlocknode %s: %w", n.Name, err)
			}
		}
	}
	cur.Object["status"] = obj.Object["status"]
	if _, err := nodes.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update airlocknode %s status: %w", n.Name, err)
	}
	return nil
}
