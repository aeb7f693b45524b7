// Package kubetest adapts client-go's and the mcs-api's clientsets (their fakes, in tests) to
// kube.Client. The agent itself does not import it: the clientsets' schemes register every API
// group of Kubernetes, which kube.NewClient's small client avoids linking.
package kubetest

import (
	"context"
	"errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	"github.com/cablemesh/cablemesh/agent/kube"
)

// errNoMCS is the answer about ServiceExports of a Client made without an mcs-api clientset.
var errNoMCS = errors.New("kubetest: no mcs-api clientset")

// Clientsets is kc and mc as a kube.Client; mc may be nil where no ServiceExport is needed (a
// NodeWatcher's). Like client-go's fakes it tells the informers it cannot serve a streaming list.
func Clientsets(kc kubernetes.Interface, mc mcsclient.Interface) kube.Client {
	return &clientsets{kc: kc, mc: mc}
}

type clientsets struct {
	kc kubernetes.Interface
	mc mcsclient.Interface
}

// IsWatchListSemanticsUnSupported keeps the informers on list-then-watch, which fakes serve.
func (*clientsets) IsWatchListSemanticsUnSupported() bool { return true }

func (c *clientsets) Nodes() kube.Resource {
	n := c.kc.CoreV1().Nodes()
	return kube.Resource{
		List:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return n.List(ctx, o) },
		Watch: n.Watch,
	}
}

func (c *clientsets) Services() kube.Resource {
	s := c.kc.CoreV1().Services(metav1.NamespaceAll)
	return kube.Resource{
		List:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.List(ctx, o) },
		Watch: s.Watch,
	}
}

func (c *clientsets) EndpointSlices() kube.Resource {
	s := c.kc.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	return kube.Resource{
		List:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.List(ctx, o) },
		Watch: s.Watch,
	}
}

func (c *clientsets) ServiceExports() kube.Resource {
	if c.mc == nil {
		return kube.Resource{
			List:  func(context.Context, metav1.ListOptions) (runtime.Object, error) { return nil, errNoMCS },
			Watch: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return nil, errNoMCS },
		}
	}
	s := c.mc.MulticlusterV1alpha1().ServiceExports(metav1.NamespaceAll)
	return kube.Resource{
		List:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return s.List(ctx, o) },
		Watch: s.Watch,
	}
}

func (c *clientsets) UpdateServiceExportStatus(ctx context.Context, se *mcsv1a1.ServiceExport) error {
	if c.mc == nil {
		return errNoMCS
	}
	_, err := c.mc.MulticlusterV1alpha1().ServiceExports(se.Namespace).UpdateStatus(ctx, se, metav1.UpdateOptions{})
	return err
}
