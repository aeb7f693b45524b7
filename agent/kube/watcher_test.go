package kube

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsfake "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned/fake"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// mcsClient is the mcs-api fake clientset made to behave as client-go's own fakes do, which its
// generated code (client-gen of Kubernetes 1.32) predates: it tells the reflector it cannot serve
// a streaming list, and its watches start from the resource version of the list before them, so
// that nothing created between an informer's list and its watch is lost.
type mcsClient struct{ *mcsfake.Clientset }

func (mcsClient) IsWatchListSemanticsUnSupported() bool { return true }

func newMCSClient(objs ...k8sruntime.Object) mcsClient {
	c := mcsfake.NewSimpleClientset(objs...)
	c.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		return true, w, err
	})
	return mcsClient{c}
}

// fixture is one Watcher over fake clientsets, running until the test ends.
type fixture struct {
	kube  *kubefake.Clientset
	mcs   mcsClient
	w     *Watcher
	calls chan []*apiv1.ServiceExport
	stop  context.CancelFunc
	done  chan error
}

// setup builds the fakes with objs (ServiceExports go to the MCS fake, the rest to the
// Kubernetes one) and a Watcher; start runs it.
func setup(t *testing.T, objs []k8sruntime.Object, opts ...Option) *fixture {
	t.Helper()
	var kubeObjs, mcsObjs []k8sruntime.Object
	for _, o := range objs {
		if _, ok := o.(*mcsv1a1.ServiceExport); ok {
			mcsObjs = append(mcsObjs, o)
		} else {
			kubeObjs = append(kubeObjs, o)
		}
	}
	f := &fixture{
		kube:  kubefake.NewClientset(kubeObjs...),
		mcs:   newMCSClient(mcsObjs...),
		calls: make(chan []*apiv1.ServiceExport, 100),
		done:  make(chan error, 1),
	}
	f.w = New(&fakeClient{kc: f.kube, mc: f.mcs}, "east", nil, opts...)
	return f
}

func (f *fixture) start(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	go func() { f.done <- f.w.Run(ctx, func(es []*apiv1.ServiceExport) { f.calls <- es }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return f
}

func start(t *testing.T, objs []k8sruntime.Object, opts ...Option) *fixture {
	t.Helper()
	return setup(t, objs, opts...).start(t)
}

// next is the next export set handed to onChange.
func (f *fixture) next(t *testing.T) []*apiv1.ServiceExport {
	t.Helper()
	select {
	case es := <-f.calls:
		return es
	case <-time.After(5 * time.Second):
		t.Fatal("onChange was not called within 5s")
		return nil
	}
}

// until waits for onChange to be handed want, failing with the last set it was handed.
func (f *fixture) until(t *testing.T, want ...*apiv1.ServiceExport) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	var last []*apiv1.ServiceExport
	for {
		select {
		case es := <-f.calls:
			if equalExports(es, want) {
				return
			}
			last = es
		case <-deadline:
			t.Fatalf("onChange was not handed\n%s\nlast handed\n%s", show(want...), show(last...))
		}
	}
}

// quiet checks that onChange is not called for d.
func (f *fixture) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case es := <-f.calls:
		t.Fatalf("onChange called again with\n%s", show(es...))
	case <-time.After(d):
	}
}

// condition waits for the Valid condition of ServiceExport ns/name to have status and reason.
func (f *fixture) condition(t *testing.T, ns, name string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		se, err := f.mcs.MulticlusterV1alpha1().ServiceExports(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get ServiceExport %s/%s: %v", ns, name, err)
		}
		if c = meta.FindStatusCondition(se.Status.Conditions, ConditionValid); c != nil && c.Status == status && c.Reason == reason {
			return *c
		}
	}
	t.Fatalf("ServiceExport %s/%s: Valid condition %+v, want status %s reason %s", ns, name, c, status, reason)
	return metav1.Condition{}
}

// statusUpdates counts the UpdateStatus calls made on ServiceExports so far.
func (f *fixture) statusUpdates() int {
	n := 0
	for _, a := range f.mcs.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func (f *fixture) create(t *testing.T, objs ...k8sruntime.Object) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *mcsv1a1.ServiceExport:
			_, err = f.mcs.MulticlusterV1alpha1().ServiceExports(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = f.kube.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discoveryv1.EndpointSlice:
			_, err = f.kube.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("create %T: not a kind the tests know", o)
		}
		if err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
}

func (f *fixture) updateSlice(t *testing.T, s *discoveryv1.EndpointSlice) {
	t.Helper()
	if _, err := f.kube.DiscoveryV1().EndpointSlices(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update EndpointSlice %s/%s: %v", s.Namespace, s.Name, err)
	}
}

func TestWatcherExports(t *testing.T) {
	webSvc := service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP))
	webPorts := []*apiv1.ServicePort{sp("http", 80, "TCP")}
	web1 := epSlice("shop", "web", "web-1", endpoint("10.1.0.1", yes, ""), endpoint("10.1.0.2", yes, ""))
	webExport := export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.1", true, ""), sep("10.1.0.2", true, ""))

	tests := []struct {
		name    string
		objs    []k8sruntime.Object
		initial []*apiv1.ServiceExport
		change  func(t *testing.T, f *fixture)
		// want is the set onChange is handed after change; noCall: change must call nothing.
		want   []*apiv1.ServiceExport
		noCall bool
	}{
		{
			name:    "an export is there from the start when its ServiceExport, Service and EndpointSlice exist",
			objs:    []k8sruntime.Object{svcExport("shop", "web"), webSvc, web1},
			initial: []*apiv1.ServiceExport{webExport},
		},
		{
			name: "an export appears when its ServiceExport, Service and EndpointSlice are created",
			change: func(t *testing.T, f *fixture) {
				f.create(t, webSvc.DeepCopy(), web1.DeepCopy(), svcExport("shop", "web"))
			},
			want: []*apiv1.ServiceExport{webExport},
		},
		{
			name:    "a pod going unready flips its endpoint's ready",
			objs:    []k8sruntime.Object{svcExport("shop", "web"), webSvc, web1},
			initial: []*apiv1.ServiceExport{webExport},
			change: func(t *testing.T, f *fixture) {
				s := web1.DeepCopy()
				s.Endpoints[1].Conditions.Ready = no
				f.updateSlice(t, s)
			},
			want: []*apiv1.ServiceExport{export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.1", true, ""), sep("10.1.0.2", false, ""))},
		},
		{
			name: "a headless Service is exported as Headless with its endpoints' hostnames",
			objs: []k8sruntime.Object{
				svcExport("db", "pg"),
				service("db", "pg", corev1.ClusterIPNone, port("pg", 5432, corev1.ProtocolTCP)),
				epSlice("db", "pg", "pg-1", endpoint("10.1.0.7", yes, "pg-0"), endpoint("10.1.0.8", nil, "pg-1")),
			},
			initial: []*apiv1.ServiceExport{export("db", "pg", "Headless", []*apiv1.ServicePort{sp("pg", 5432, "TCP")},
				sep("10.1.0.7", true, "pg-0"), sep("10.1.0.8", true, "pg-1"))},
		},
		{
			name:    "deleting the ServiceExport removes the export",
			objs:    []k8sruntime.Object{svcExport("shop", "web"), webSvc, web1},
			initial: []*apiv1.ServiceExport{webExport},
			change: func(t *testing.T, f *fixture) {
				if err := f.mcs.MulticlusterV1alpha1().ServiceExports("shop").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			want: nil,
		},
		{
			name:    "deleting the Service removes the export",
			objs:    []k8sruntime.Object{svcExport("shop", "web"), webSvc, web1},
			initial: []*apiv1.ServiceExport{webExport},
			change: func(t *testing.T, f *fixture) {
				if err := f.kube.CoreV1().Services("shop").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			want: nil,
		},
		{
			name: "a ServiceExport without a Service gives no export",
			objs: []k8sruntime.Object{svcExport("shop", "web"), web1},
		},
		{
			name:    "a second EndpointSlice merges into the export",
			objs:    []k8sruntime.Object{svcExport("shop", "web"), webSvc, web1},
			initial: []*apiv1.ServiceExport{webExport},
			change: func(t *testing.T, f *fixture) {
				f.create(t, epSlice("shop", "web", "web-2", endpoint("10.1.0.3", yes, ""), endpoint("10.1.0.2", yes, "")))
			},
			want: []*apiv1.ServiceExport{export("shop", "web", "ClusterSetIP", webPorts,
				sep("10.1.0.1", true, ""), sep("10.1.0.2", true, ""), sep("10.1.0.3", true, ""))},
		},
		{
			name: "ports keep their names and protocols",
			objs: []k8sruntime.Object{
				svcExport("kube-system", "dns"),
				service("kube-system", "dns", "10.96.0.53", port("dns", 53, corev1.ProtocolUDP), port("dns-tcp", 53, corev1.ProtocolTCP)),
			},
			initial: []*apiv1.ServiceExport{export("kube-system", "dns", "ClusterSetIP",
				[]*apiv1.ServicePort{sp("dns", 53, "UDP"), sp("dns-tcp", 53, "TCP")})},
		},
		{
			name: "labels and affinity are carried from the ServiceExport",
			objs: []k8sruntime.Object{svcExport("shop", "web", withLabels("tier", "front"), withAffinity("none")), webSvc},
			initial: func() []*apiv1.ServiceExport {
				e := export("shop", "web", "ClusterSetIP", webPorts)
				e.Labels["tier"], e.Affinity = "front", "none"
				return []*apiv1.ServiceExport{e}
			}(),
		},
		{
			name: "exports are sorted by namespace and name",
			objs: []k8sruntime.Object{
				svcExport("shop", "web"), webSvc,
				svcExport("db", "pg"), service("db", "pg", corev1.ClusterIPNone),
				svcExport("shop", "api"), service("shop", "api", "10.96.0.11", port("", 8080, corev1.ProtocolTCP)),
			},
			initial: []*apiv1.ServiceExport{
				export("db", "pg", "Headless", nil),
				export("shop", "api", "ClusterSetIP", []*apiv1.ServicePort{sp("", 8080, "TCP")}),
				export("shop", "web", "ClusterSetIP", webPorts),
			},
		},
		{
			name:    "a change to a Service nobody exports calls nothing",
			objs:    []k8sruntime.Object{svcExport("shop", "web"), webSvc, web1},
			initial: []*apiv1.ServiceExport{webExport},
			change: func(t *testing.T, f *fixture) {
				f.create(t, service("shop", "cart", "10.96.0.12", port("http", 80, corev1.ProtocolTCP)),
					epSlice("shop", "cart", "cart-1", endpoint("10.1.0.9", yes, "")))
			},
			noCall: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, tt.objs)
			if got := f.next(t); !equalExports(got, tt.initial) {
				t.Fatalf("first set\n%s\nwant\n%s", show(got...), show(tt.initial...))
			}
			if tt.change == nil {
				return
			}
			tt.change(t, f)
			if tt.noCall {
				f.quiet(t, 300*time.Millisecond)
				return
			}
			f.until(t, tt.want...)
		})
	}
}

func TestWatcherStatus(t *testing.T) {
	t.Run("a ServiceExport without a Service is Valid=False NoService, and Valid=True once the Service exists", func(t *testing.T) {
		f := start(t, []k8sruntime.Object{svcExport("shop", "web")})
		f.next(t)
		c := f.condition(t, "shop", "web", metav1.ConditionFalse, ReasonNoService)
		if c.Message != "Service shop/web not found" {
			t.Errorf("message %q", c.Message)
		}
		f.create(t, service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP)))
		f.until(t, export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{sp("http", 80, "TCP")}))
		f.condition(t, "shop", "web", metav1.ConditionTrue, ReasonValid)
	})

	t.Run("an invalid affinity annotation is Valid=False InvalidExport naming the annotation", func(t *testing.T) {
		f := start(t, []k8sruntime.Object{svcExport("shop", "web", withAffinity("sticky")),
			service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP))})
		if got := f.next(t); len(got) != 0 {
			t.Fatalf("exported %s", show(got...))
		}
		c := f.condition(t, "shop", "web", metav1.ConditionFalse, ReasonInvalidExport)
		if c.Message != `annotation cablemesh.io/affinity: "sticky" is not local or none` {
			t.Errorf("message %q", c.Message)
		}
	})

	t.Run("the status is written once and not again while it does not change", func(t *testing.T) {
		slice := epSlice("shop", "web", "web-1", endpoint("10.1.0.1", yes, ""))
		f := start(t, []k8sruntime.Object{svcExport("shop", "web"),
			service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP)), slice})
		f.next(t)
		f.condition(t, "shop", "web", metav1.ConditionTrue, ReasonValid)
		for _, ready := range []*bool{no, yes, no} {
			s := slice.DeepCopy()
			s.Endpoints[0].Conditions.Ready = ready
			f.updateSlice(t, s)
			f.until(t, export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{sp("http", 80, "TCP")}, sep("10.1.0.1", *ready, "")))
		}
		time.Sleep(200 * time.Millisecond) // let the status update's own watch event come back
		if n := f.statusUpdates(); n != 1 {
			t.Errorf("%d status updates, want 1", n)
		}
	})

	t.Run("a status already right is not written", func(t *testing.T) {
		se := svcExport("shop", "web")
		se.Status.Conditions = []metav1.Condition{validCondition(Validity{Reason: ReasonNoService, Message: "Service shop/web not found"}, 0)}
		f := start(t, []k8sruntime.Object{se})
		f.next(t)
		f.quiet(t, 200*time.Millisecond)
		if n := f.statusUpdates(); n != 0 {
			t.Errorf("%d status updates, want 0", n)
		}
	})

	t.Run("a failed status update is retried", func(t *testing.T) {
		f := setup(t, []k8sruntime.Object{svcExport("shop", "web")})
		failures := 1
		f.mcs.PrependReactor("update", "serviceexports", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
			if a.GetSubresource() == "status" && failures > 0 {
				failures--
				return true, nil, errors.New("apiserver unavailable")
			}
			return false, nil, nil
		})
		f.start(t)
		f.next(t)
		f.condition(t, "shop", "web", metav1.ConditionFalse, ReasonNoService)
		if n := f.statusUpdates(); n != 2 {
			t.Errorf("%d status updates, want 2 (one failed, one retried)", n)
		}
	})

	t.Run("WithStatusUpdates(false) writes no status", func(t *testing.T) {
		f := start(t, []k8sruntime.Object{svcExport("shop", "web")}, WithStatusUpdates(false))
		f.next(t)
		f.quiet(t, 200*time.Millisecond)
		if n := f.statusUpdates(); n != 0 {
			t.Errorf("%d status updates, want 0", n)
		}
	})
}

func TestWatcherCalls(t *testing.T) {
	t.Run("onChange is not called before the caches have synced", func(t *testing.T) {
		f := setup(t, []k8sruntime.Object{svcExport("shop", "web"),
			service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP)),
			epSlice("shop", "web", "web-1", endpoint("10.1.0.1", yes, ""))})
		release := make(chan struct{})
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		f.kube.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
			<-release
			return false, nil, nil
		})
		f.start(t)
		t.Cleanup(unblock) // before the Watcher is stopped, which waits for the blocked list
		f.quiet(t, 300*time.Millisecond)
		if f.w.HasSynced() {
			t.Fatal("HasSynced before the EndpointSlices were listed")
		}
		unblock()
		want := export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{sp("http", 80, "TCP")}, sep("10.1.0.1", true, ""))
		if got := f.next(t); !equalExports(got, []*apiv1.ServiceExport{want}) {
			t.Fatalf("first set\n%s\nwant it complete\n%s", show(got...), show(want))
		}
		if !f.w.HasSynced() {
			t.Error("not HasSynced after the first set")
		}
	})

	t.Run("an empty cluster still gets one call with the empty set", func(t *testing.T) {
		f := start(t, nil)
		if got := f.next(t); len(got) != 0 {
			t.Fatalf("first set %s", show(got...))
		}
		f.quiet(t, 200*time.Millisecond)
	})

	t.Run("a rollout of 50 pods is one call", func(t *testing.T) {
		slice := epSlice("shop", "web", "web-1")
		f := start(t, []k8sruntime.Object{svcExport("shop", "web"),
			service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP)), slice}, WithDebounce(time.Second))
		f.next(t)
		var want []*apiv1.ServiceEndpoint
		for i := range 50 {
			ip := fmt.Sprintf("10.1.0.%d", i+1)
			slice.Endpoints = append(slice.Endpoints, endpoint(ip, yes, ""))
			f.updateSlice(t, slice.DeepCopy())
			want = append(want, sep(ip, true, ""))
		}
		wantSet := []*apiv1.ServiceExport{export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{sp("http", 80, "TCP")}, want...)}
		if got := f.next(t); !equalExports(got, wantSet) {
			t.Fatalf("after the burst\n%s\nwant\n%s", show(got...), show(wantSet...))
		}
		f.quiet(t, 500*time.Millisecond)
	})

	t.Run("onChange owns what it is handed", func(t *testing.T) {
		f := start(t, []k8sruntime.Object{svcExport("shop", "web"),
			service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP))})
		f.next(t)[0].Node = "node-1" // as a caller stamping its node would
		f.create(t, svcExport("shop", "api"), service("shop", "api", "10.96.0.11", port("http", 80, corev1.ProtocolTCP)))
		got := f.next(t)
		if len(got) != 2 || got[1].Node != "" {
			t.Fatalf("second set\n%s", show(got...))
		}
	})
}

func TestWatcherStops(t *testing.T) {
	t.Run("Run returns and leaves no goroutine once its context ends", func(t *testing.T) {
		before := runtime.NumGoroutine()
		f := setup(t, []k8sruntime.Object{svcExport("shop", "web"),
			service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP))})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- f.w.Run(ctx, func([]*apiv1.ServiceExport) {}) }()
		for !f.w.HasSynced() {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run = %v after sync, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
		n := runtime.NumGoroutine()
		for deadline := time.Now().Add(5 * time.Second); n > before && time.Now().Before(deadline); n = runtime.NumGoroutine() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > before {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Run returned, %d before\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
	})

	t.Run("Run says which cache never synced when ServiceExports cannot be listed", func(t *testing.T) {
		f := setup(t, nil)
		f.mcs.PrependReactor("list", "serviceexports", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "multicluster.x-k8s.io", Resource: "serviceexports"}, "")
		})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		called := false
		err := f.w.Run(ctx, func([]*apiv1.ServiceExport) { called = true })
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ServiceExport") || called {
			t.Fatalf("Run = %v, onChange called %v; want a deadline error naming ServiceExport and no call", err, called)
		}
	})

	t.Run("a Watcher runs once", func(t *testing.T) {
		f := start(t, nil)
		f.next(t)
		if err := f.w.Run(context.Background(), func([]*apiv1.ServiceExport) {}); err == nil {
			t.Fatal("second Run returned nil")
		}
	})
}
