package mcsimport

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The writer's election: the holder of the Lease LeaseName in the agent's namespace writes; it
// renews it every RenewInterval, and another gateway takes it over once it was not renewed for
// LeaseDuration.
const (
	LeaseName     = "cablemesh-service-imports"
	LeaseDuration = 15 * time.Second
	RenewInterval = 5 * time.Second
)

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// election holds or seeks the writer's Lease for identity.
type election struct {
	api       API
	namespace string
	identity  string
	now       func() time.Time
	// validUntil is when this node's hold ends unless renewed; zero when it holds none.
	validUntil time.Time
}

// leading tells whether this node holds the lease now.
func (e *election) leading() bool {
	return !e.validUntil.IsZero() && e.now().Before(e.validUntil)
}

// tryAcquireOrRenew renews the lease this node holds, creates it when there is none and takes
// it over when its holder let it expire. It returns whether this node holds it afterwards; any
// failure (a conflict with another gateway's write among them) ends the hold, so that two
// writers never both believe they lead.
func (e *election) tryAcquireOrRenew(ctx context.Context) (bool, error) {
	now := e.now()
	l, err := e.api.GetLease(ctx, e.namespace, LeaseName)
	if isNotFound(err) {
		if _, err := e.api.CreateLease(ctx, e.newLease(now)); err != nil {
			e.validUntil = time.Time{}
			return false, fmt.Errorf("create lease %s/%s: %w", e.namespace, LeaseName, err)
		}
		e.validUntil = now.Add(LeaseDuration)
		return true, nil
	}
	if err != nil {
		e.validUntil = time.Time{}
		return false, fmt.Errorf("get lease %s/%s: %w", e.namespace, LeaseName, err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder != e.identity && holder != "" && !expired(l, now) {
		e.validUntil = time.Time{}
		return false, nil
	}
	next := l.DeepCopy()
	if holder != e.identity {
		transitions := int32(0)
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions
		}
		transitions++
		next.Spec = e.newLease(now).Spec
		next.Spec.LeaseTransitions = &transitions
	} else {
		renew := metav1.NewMicroTime(now)
		next.Spec.RenewTime = &renew
		d := int32(LeaseDuration / time.Second)
		next.Spec.LeaseDurationSeconds = &d
	}
	if _, err := e.api.UpdateLease(ctx, next); err != nil {
		e.validUntil = time.Time{}
		if apierrors.IsConflict(err) {
			return false, nil // another gateway wrote it first
		}
		return false, fmt.Errorf("update lease %s/%s: %w", e.namespace, LeaseName, err)
	}
	e.validUntil = now.Add(LeaseDuration)
	return true, nil
}

func (e *election) newLease(now time.Time) *coordinationv1.Lease {
	d := int32(LeaseDuration / time.Second)
	t := metav1.NewMicroTime(now)
	id := e.identity
	return &coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: LeaseName},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &d, AcquireTime: &t, RenewTime: &t},
	}
}

// expired tells whether l's holder let it lapse: not renewed for its duration (or never).
func expired(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil {
		return true
	}
	d := LeaseDuration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return !now.Before(l.Spec.RenewTime.Add(d))
}
