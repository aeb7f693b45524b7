package uninstall

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/cablemesh/cablemesh/agent/kube"
)

// restClient is the Client of an API server: REST clients of core/v1 and apps/v1 with a scheme
// of those two groups only (as agent/kube's, not client-go's clientset, which links every group).
type restClient struct {
	core, apps *rest.RESTClient
	params     runtime.ParameterCodec
}

// NewClient is the Client of the API server rc reaches.
func NewClient(rc *rest.Config) (Client, error) {
	g, err := kube.NewRESTGroups(rc, []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme},
		corev1.SchemeGroupVersion, appsv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("uninstall check: %w", err)
	}
	return &restClient{core: g.For(corev1.SchemeGroupVersion), apps: g.For(appsv1.SchemeGroupVersion), params: g.Params}, nil
}

func (c *restClient) resource(rc *rest.RESTClient, resource, namespace string, newList func() runtime.Object) Resource {
	req := func(opts *metav1.ListOptions) *rest.Request {
		r := rc.Get()
		if namespace != "" {
			r = r.Namespace(namespace)
		}
		r = r.Resource(resource).VersionedParams(opts, c.params)
		if opts.TimeoutSeconds != nil {
			r = r.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
		}
		return r
	}
	return Resource{
		List: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			out := newList()
			if err := req(&opts).Do(ctx).Into(out); err != nil {
				return nil, err
			}
			return out, nil
		},
		Watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			return req(&opts).Watch(ctx)
		},
	}
}

func (c *restClient) DaemonSets(namespace string) Resource {
	return c.resource(c.apps, "daemonsets", namespace, func() runtime.Object { return &appsv1.DaemonSetList{} })
}

func (c *restClient) Namespaces() Resource {
	return c.resource(c.core, "namespaces", "", func() runtime.Object { return &corev1.NamespaceList{} })
}

func (c *restClient) GetDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error) {
	out := &appsv1.DaemonSet{}
	return out, c.apps.Get().Namespace(namespace).Resource("daemonsets").Name(name).Do(ctx).Into(out)
}

func (c *restClient) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	out := &corev1.Namespace{}
	return out, c.core.Get().Resource("namespaces").Name(name).Do(ctx).Into(out)
}
