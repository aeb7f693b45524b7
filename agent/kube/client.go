package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// Resource lists and watches one kind of object, in every namespace the client reaches. Its
// functions take the options an informer's reflector gives (resource version, bookmarks,
// selectors, timeout) and pass them on.
type Resource struct {
	List  func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	Watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Client is what the agent reads and writes on Kubernetes: the informers of the Watcher and the
// NodeWatcher list and watch through it, and the Watcher writes the ServiceExports' Valid
// condition through it. NewClient is the API server's; a Client may also implement
// IsWatchListSemanticsUnSupported() bool (as client-go's fakes do) to keep the informers from
// asking it for a streaming list.
type Client interface {
	Nodes() Resource
	Services() Resource
	EndpointSlices() Resource
	ServiceExports() Resource
	// UpdateServiceExportStatus writes se's status (its status subresource). A NotFound or
	// Conflict error is returned as the API server gave it (apierrors.IsNotFound, IsConflict).
	UpdateServiceExportStatus(ctx context.Context, se *mcsv1a1.ServiceExport) error
}

// newInformer is an informer over r with the given selectors (tweak, may be nil), as client-go's
// generated informers build theirs: a ListWatch asking c whether it can serve a streaming list.
func newInformer(c Client, r Resource, obj runtime.Object, resync time.Duration, indexers cache.Indexers, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			return r.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			return r.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c), obj, resync, indexers)
}

// restClient is the Client of an API server: one REST client per API group the agent uses, with
// a scheme that holds only the agent's types (not client-go's clientset, whose scheme registers
// every API group and so links every one into the agent).
type restClient struct {
	core, discovery, mcs *rest.RESTClient
	params               runtime.ParameterCodec
}

// NewClient is the Client of the API server rc reaches.
func NewClient(rc *rest.Config) (Client, error) {
	g, err := NewRESTGroups(rc, []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, mcsv1a1.Install},
		corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion, mcsv1a1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("kubernetes %w", err)
	}
	return &restClient{core: g.For(corev1.SchemeGroupVersion), discovery: g.For(discoveryv1.SchemeGroupVersion),
		mcs: g.For(mcsv1a1.SchemeGroupVersion), params: g.Params}, nil
}

// resource lists and watches resource of c across all namespaces (or cluster-wide), into list,
// as client-go's generated clients do.
func (c *restClient) resource(rc *rest.RESTClient, resource string, namespaced bool, newList func() runtime.Object) Resource {
	req := func(opts *metav1.ListOptions) *rest.Request {
		r := rc.Get()
		if namespaced {
			r = r.Namespace(metav1.NamespaceAll)
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

func (c *restClient) Nodes() Resource {
	return c.resource(c.core, "nodes", false, func() runtime.Object { return &corev1.NodeList{} })
}

func (c *restClient) Services() Resource {
	return c.resource(c.core, "services", true, func() runtime.Object { return &corev1.ServiceList{} })
}

func (c *restClient) EndpointSlices() Resource {
	return c.resource(c.discovery, "endpointslices", true, func() runtime.Object { return &discoveryv1.EndpointSliceList{} })
}

func (c *restClient) ServiceExports() Resource {
	return c.resource(c.mcs, "serviceexports", true, func() runtime.Object { return &mcsv1a1.ServiceExportList{} })
}

func (c *restClient) UpdateServiceExportStatus(ctx context.Context, se *mcsv1a1.ServiceExport) error {
	return c.mcs.Put().Namespace(se.Namespace).Resource("serviceexports").Name(se.Name).SubResource("status").
		VersionedParams(&metav1.UpdateOptions{}, c.params).Body(se).Do(ctx).Into(&mcsv1a1.ServiceExport{})
}
