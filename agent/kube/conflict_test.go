package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// conflictOf waits for the ServiceExport's Conflict condition to have status and reason.
func (f *fixture) conflictOf(t *testing.T, ns, name string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		se, err := f.mcs.MulticlusterV1alpha1().ServiceExports(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get ServiceExport %s/%s: %v", ns, name, err)
		}
		if c = meta.FindStatusCondition(se.Status.Conditions, ConditionConflict); c != nil && c.Status == status && c.Reason == reason {
			return *c
		}
	}
	t.Fatalf("ServiceExport %s/%s: Conflict condition %+v, want status %s reason %s", ns, name, c, status, reason)
	return metav1.Condition{}
}

func TestWatcherConflictCondition(t *testing.T) {
	objs := func() []k8sruntime.Object {
		return []k8sruntime.Object{svcExport("shop", "web"), service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP)),
			svcExport("shop", "db"), service("shop", "db", "10.96.0.11", port("pg", 5432, corev1.ProtocolTCP))}
	}

	t.Run("no Conflict condition is written before the broker answered", func(t *testing.T) {
		f := start(t, objs())
		f.next(t)
		f.condition(t, "shop", "web", metav1.ConditionTrue, ReasonValid)
		f.quiet(t, 200*time.Millisecond)
		se, err := f.mcs.MulticlusterV1alpha1().ServiceExports("shop").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(se.Status.Conditions, ConditionConflict); c != nil {
			t.Fatalf("Conflict condition %+v written before the broker said anything", c)
		}
	})

	t.Run("the broker's conflict is Conflict=True on that export only, and False again once it is gone", func(t *testing.T) {
		f := start(t, objs())
		f.next(t)
		f.w.SetConflicts([]statusapi.ServiceConflict{{Cluster: "east", Field: "ports",
			Message: "shop/web: port 80/TCP is named http here but web in the oldest export (cluster west)"}})
		c := f.conflictOf(t, "shop", "web", metav1.ConditionTrue, ReasonPortConflict)
		if !strings.Contains(c.Message, "port 80/TCP is named http here but web in the oldest export (cluster west)") || strings.Contains(c.Message, "shop/web:") {
			t.Errorf("message %q: want the broker's reason without the service's key", c.Message)
		}
		f.conflictOf(t, "shop", "db", metav1.ConditionFalse, ReasonNoConflicts)
		// The Valid condition stays as it was.
		f.condition(t, "shop", "web", metav1.ConditionTrue, ReasonValid)

		f.w.SetConflicts(nil)
		f.conflictOf(t, "shop", "web", metav1.ConditionFalse, ReasonNoConflicts)
	})

	t.Run("a type conflict is TypeConflict", func(t *testing.T) {
		f := start(t, objs())
		f.next(t)
		f.w.SetConflicts([]statusapi.ServiceConflict{{Cluster: "east", Field: "type", Message: "shop/db: exported as Headless, but the oldest export (cluster west) is ClusterSetIP"}})
		f.conflictOf(t, "shop", "db", metav1.ConditionTrue, ReasonTypeConflict)
	})

	t.Run("an invalid export gets no Conflict condition", func(t *testing.T) {
		f := start(t, []k8sruntime.Object{svcExport("shop", "gone")})
		f.next(t)
		f.w.SetConflicts([]statusapi.ServiceConflict{{Cluster: "east", Field: "type", Message: "shop/gone: exported as Headless"}})
		f.condition(t, "shop", "gone", metav1.ConditionFalse, ReasonNoService)
		f.quiet(t, 200*time.Millisecond)
		se, err := f.mcs.MulticlusterV1alpha1().ServiceExports("shop").Get(context.Background(), "gone", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(se.Status.Conditions, ConditionConflict); c != nil {
			t.Fatalf("Conflict condition %+v on an invalid export", c)
		}
	})
}

func TestConflictConditionOfSeveralFields(t *testing.T) {
	c := conflictCondition([]statusapi.ServiceConflict{{Field: "ports", Message: "a"}, {Field: "type", Message: "b"}}, 4)
	if c.Status != metav1.ConditionTrue || c.Reason != reasonOtherConflict || c.ObservedGeneration != 4 {
		t.Fatalf("condition %+v: want True, reason %s, generation 4", c, reasonOtherConflict)
	}
	if !strings.Contains(c.Message, "ports: a") || !strings.Contains(c.Message, "type: b") {
		t.Errorf("message %q lacks a conflict", c.Message)
	}
}
