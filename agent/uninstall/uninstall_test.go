package uninstall

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeClient is client-go's fake clientset as a Client.
type fakeClient struct{ kc kubernetes.Interface }

// IsWatchListSemanticsUnSupported keeps the informers on list-then-watch, which fakes serve.
func (*fakeClient) IsWatchListSemanticsUnSupported() bool { return true }

func (c *fakeClient) DaemonSets(ns string) Resource {
	d := c.kc.AppsV1().DaemonSets(ns)
	return Resource{List: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return d.List(ctx, o) }, Watch: d.Watch}
}

func (c *fakeClient) Namespaces() Resource {
	n := c.kc.CoreV1().Namespaces()
	return Resource{List: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return n.List(ctx, o) }, Watch: n.Watch}
}

func (c *fakeClient) GetDaemonSet(ctx context.Context, ns, name string) (*appsv1.DaemonSet, error) {
	return c.kc.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c *fakeClient) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	return c.kc.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
}

const (
	testNS = "cablemesh"
	testDS = "cable-agent"
)

func installed() *fake.Clientset {
	return fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}},
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: testDS, Namespace: testNS, UID: "u1"}},
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "cable-agent-worker", Namespace: testNS, UID: "u2"}},
	)
}

// running starts a Detector on kc and waits until its watch has read the DaemonSet.
func running(t *testing.T, kc *fake.Clientset) *Detector {
	t.Helper()
	d := &Detector{Client: &fakeClient{kc}, Namespace: testNS, DaemonSet: testDS}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "the watch read the DaemonSet", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.seen
	})
	return d
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting until %s", what)
}

func watched(d *Detector) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reason
}

// refuse makes every GET of kind answer err, as the API server does once the agent's service
// account (401) or role (403) is deleted.
func refuse(kc *fake.Clientset, resource string, err error) {
	kc.PrependReactor("get", resource, func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, err })
}

func check(t *testing.T, d *Detector, wantUninstall bool, wantReason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
	defer cancel()
	v := d.Check(ctx)
	if v.Uninstall != wantUninstall || !strings.Contains(v.Reason, wantReason) {
		t.Errorf("Check = %+v; want uninstall %v with a reason naming %q", v, wantUninstall, wantReason)
	}
}

func TestARestartKeepsTheNodesState(t *testing.T) {
	d := running(t, installed())
	check(t, d, false, "a restart")
}

func TestADeletedDaemonSetIsAnUninstall(t *testing.T) {
	kc := installed()
	d := running(t, kc)
	if err := kc.AppsV1().DaemonSets(testNS).Delete(context.Background(), testDS, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch saw the deletion", func() bool { return strings.Contains(watched(d), "was deleted") })
	check(t, d, true, "is gone")
}

func TestTheOtherDaemonSetsDeletionIsNotOurs(t *testing.T) {
	kc := installed()
	d := running(t, kc)
	if err := kc.AppsV1().DaemonSets(testNS).Delete(context.Background(), "cable-agent-worker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if r := watched(d); r != "" {
		t.Errorf("the workers' DaemonSet deleted: the gateway's detector says %q", r)
	}
	check(t, d, false, "a restart")
}

func TestADaemonSetBeingDeletedIsAnUninstall(t *testing.T) {
	kc := installed()
	d := running(t, kc)
	ds, _ := kc.AppsV1().DaemonSets(testNS).Get(context.Background(), testDS, metav1.GetOptions{})
	now := metav1.Now()
	ds.DeletionTimestamp = &now
	if _, err := kc.AppsV1().DaemonSets(testNS).Update(context.Background(), ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch saw the deletionTimestamp", func() bool { return strings.Contains(watched(d), "being deleted") })
	check(t, d, true, "being deleted")
}

func TestATerminatingNamespaceIsAnUninstall(t *testing.T) {
	kc := installed()
	d := running(t, kc)
	ns, _ := kc.CoreV1().Namespaces().Get(context.Background(), testNS, metav1.GetOptions{})
	ns.Status.Phase = corev1.NamespaceTerminating
	if _, err := kc.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch saw the namespace terminating", func() bool { return strings.Contains(watched(d), "terminating") })
	check(t, d, true, "terminating")
}

func TestWithdrawnGrantsAfterTheWatchSawTheDeletion(t *testing.T) {
	for _, err := range []error{
		apierrors.NewUnauthorized("token of a deleted service account"),
		apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, testDS, errors.New("no role")),
	} {
		t.Run(string(apierrors.ReasonForError(err)), func(t *testing.T) {
			kc := installed()
			d := running(t, kc)
			refuse(kc, "daemonsets", err)
			check(t, d, true, "service account or role was deleted")
		})
	}
}

func TestForbiddenFromTheStartKeepsTheState(t *testing.T) {
	// An agent whose role never granted the DaemonSet (an old install's RBAC with a new image):
	// a refusal says nothing about an uninstall, and every restart would clean the node.
	kc := installed()
	refuse(kc, "daemonsets", apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, testDS, errors.New("no role")))
	d := &Detector{Client: &fakeClient{kc}, Namespace: testNS, DaemonSet: testDS}
	check(t, d, false, "keeping the node's state")
}

func TestNoAnswerFallsBackOnTheWatch(t *testing.T) {
	kc := installed()
	d := running(t, kc)
	down := errors.New("connection refused")
	refuse(kc, "daemonsets", down)
	check(t, d, false, "keeping the node's state")

	if err := kc.AppsV1().DaemonSets(testNS).Delete(context.Background(), testDS, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch saw the deletion", func() bool { return watched(d) != "" })
	check(t, d, true, "was deleted")
}

func TestAReinstallIsARestart(t *testing.T) {
	kc := installed()
	d := running(t, kc)
	if err := kc.AppsV1().DaemonSets(testNS).Delete(context.Background(), testDS, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch saw the deletion", func() bool { return watched(d) != "" })
	if _, err := kc.AppsV1().DaemonSets(testNS).Create(context.Background(), &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: testDS, Namespace: testNS, UID: "u3"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch saw the new DaemonSet", func() bool { return watched(d) == "" })
	check(t, d, false, "a restart")
}

func TestClearDirKeepsTheDirItself(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"agent.key", "wireguard/cbl-wg0.key"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := ClearDir(dir); err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("after ClearDir: %v %v, want an empty dir", left, err)
	}
	if err := ClearDir(filepath.Join(dir, "absent")); err != nil {
		t.Errorf("a missing dir: %v", err)
	}
}

func TestFromEnvironmentOutsideAPod(t *testing.T) {
	env := map[string]string{NamespaceEnv: "cablemesh"}
	d, err := FromEnvironment(func(k string) string { return env[k] }, nil)
	if d != nil || err != nil {
		t.Errorf("without %s: %v %v, want no detector and no error", DaemonSetEnv, d, err)
	}
	env[DaemonSetEnv] = "cable-agent"
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if d, err := FromEnvironment(func(k string) string { return env[k] }, nil); d != nil || err == nil || !strings.Contains(err.Error(), "cablemesh/cable-agent") {
		t.Errorf("outside a cluster: %v %v, want an error naming the DaemonSet", d, err)
	}
}
