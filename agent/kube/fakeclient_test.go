package kube

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"
)

// fakeClient is the fake clientsets as a Client, as kubetest.Clientsets makes them for other
// packages (which this package's tests cannot import: it imports this package). Like client-go's
// fakes it tells the informers it cannot serve a streaming list.
type fakeClient struct {
	kc kubernetes.Interface
	mc mcsclient.Interface
}

func (*fakeClient) IsWatchListSemanticsUnSupported() bool { return true }

func (c *fakeClient) Nodes() Resource {
	n := c.kc.CoreV1().Nodes()
	return Resource{List: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return n.List(ctx, o) }, Watch: n.Watch}
}

func (c *fakeClient) Services() Resource {
	s := c.kc.CoreV1().Services(metav1.NamespaceAll)
	return Resource{List: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.List(ctx, o) }, Watch: s.Watch}
}

func (c *fakeClient) EndpointSlices() Resource {
	s := c.kc.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	return Resource{List: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.List(ctx, o) }, Watch: s.Watch}
}

func (c *fakeClient) ServiceExports() Resource {
	s := c.mc.MulticlusterV1alpha1().ServiceExports(metav1.NamespaceAll)
	return Resource{List: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.List(ctx, o) }, Watch: s.Watch}
}

func (c *fakeClient) UpdateServiceExportStatus(ctx context.Context, se *mcsv1a1.ServiceExport) error {
	_, err := c.mc.MulticlusterV1alpha1().ServiceExports(se.Namespace).UpdateStatus(ctx, se, metav1.UpdateOptions{})
	return err
}
