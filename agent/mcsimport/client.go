package mcsimport

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/cablemesh/cablemesh/agent/kube"
)

// API is what the writer reads and writes on the API server. Errors are the API server's, so
// apierrors.IsNotFound, IsConflict and IsAlreadyExists work on them; a create in a namespace that
// does not exist fails NotFound naming the namespace (the NamespaceLifecycle admission), which is
// how the writer learns of it without the right to read namespaces.
type API interface {
	// ListServiceImports and ListEndpointSlices list, in every namespace, the objects whose
	// labels match selector.
	ListServiceImports(ctx context.Context, selector string) ([]mcsv1a1.ServiceImport, error)
	CreateServiceImport(ctx context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error)
	UpdateServiceImport(ctx context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error)
	UpdateServiceImportStatus(ctx context.Context, si *mcsv1a1.ServiceImport) error
	DeleteServiceImport(ctx context.Context, ns, name string) error

	ListEndpointSlices(ctx context.Context, selector string) ([]discoveryv1.EndpointSlice, error)
	CreateEndpointSlice(ctx context.Context, es *discoveryv1.EndpointSlice) error
	UpdateEndpointSlice(ctx context.Context, es *discoveryv1.EndpointSlice) error
	DeleteEndpointSlice(ctx context.Context, ns, name string) error

	GetLease(ctx context.Context, ns, name string) (*coordinationv1.Lease, error)
	CreateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	UpdateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
}

// restAPI is the API of an API server, over one REST client per API group, with a scheme of
// only these types (as agent/kube does, so the agent does not link client-go's clientset).
type restAPI struct {
	core, discovery, mcs, coordination *rest.RESTClient
	params                             runtime.ParameterCodec
}

// NewAPI is the API of the API server rc reaches.
func NewAPI(rc *rest.Config) (API, error) {
	g, err := kube.NewRESTGroups(rc, []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, mcsv1a1.Install, coordinationv1.AddToScheme},
		corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion, mcsv1a1.SchemeGroupVersion, coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("service imports: kubernetes %w", err)
	}
	return &restAPI{core: g.For(corev1.SchemeGroupVersion), discovery: g.For(discoveryv1.SchemeGroupVersion),
		mcs: g.For(mcsv1a1.SchemeGroupVersion), coordination: g.For(coordinationv1.SchemeGroupVersion), params: g.Params}, nil
}

func (a *restAPI) ListServiceImports(ctx context.Context, selector string) ([]mcsv1a1.ServiceImport, error) {
	var out mcsv1a1.ServiceImportList
	err := a.mcs.Get().Resource("serviceimports").VersionedParams(&metav1.ListOptions{LabelSelector: selector}, a.params).Do(ctx).Into(&out)
	return out.Items, err
}

func (a *restAPI) CreateServiceImport(ctx context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error) {
	out := &mcsv1a1.ServiceImport{}
	err := a.mcs.Post().Namespace(si.Namespace).Resource("serviceimports").Body(si).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) UpdateServiceImport(ctx context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error) {
	out := &mcsv1a1.ServiceImport{}
	err := a.mcs.Put().Namespace(si.Namespace).Resource("serviceimports").Name(si.Name).Body(si).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) UpdateServiceImportStatus(ctx context.Context, si *mcsv1a1.ServiceImport) error {
	return a.mcs.Put().Namespace(si.Namespace).Resource("serviceimports").Name(si.Name).SubResource("status").Body(si).Do(ctx).Into(&mcsv1a1.ServiceImport{})
}

func (a *restAPI) DeleteServiceImport(ctx context.Context, ns, name string) error {
	return a.mcs.Delete().Namespace(ns).Resource("serviceimports").Name(name).Do(ctx).Error()
}

func (a *restAPI) ListEndpointSlices(ctx context.Context, selector string) ([]discoveryv1.EndpointSlice, error) {
	var out discoveryv1.EndpointSliceList
	err := a.discovery.Get().Resource("endpointslices").VersionedParams(&metav1.ListOptions{LabelSelector: selector}, a.params).Do(ctx).Into(&out)
	return out.Items, err
}

func (a *restAPI) CreateEndpointSlice(ctx context.Context, es *discoveryv1.EndpointSlice) error {
	return a.discovery.Post().Namespace(es.Namespace).Resource("endpointslices").Body(es).Do(ctx).Into(&discoveryv1.EndpointSlice{})
}

func (a *restAPI) UpdateEndpointSlice(ctx context.Context, es *discoveryv1.EndpointSlice) error {
	return a.discovery.Put().Namespace(es.Namespace).Resource("endpointslices").Name(es.Name).Body(es).Do(ctx).Into(&discoveryv1.EndpointSlice{})
}

func (a *restAPI) DeleteEndpointSlice(ctx context.Context, ns, name string) error {
	return a.discovery.Delete().Namespace(ns).Resource("endpointslices").Name(name).Do(ctx).Error()
}

func (a *restAPI) GetLease(ctx context.Context, ns, name string) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := a.coordination.Get().Namespace(ns).Resource("leases").Name(name).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) CreateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := a.coordination.Post().Namespace(l.Namespace).Resource("leases").Body(l).Do(ctx).Into(out)
	return out, err
}

func (a *restAPI) UpdateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := a.coordination.Put().Namespace(l.Namespace).Resource("leases").Name(l.Name).Body(l).Do(ctx).Into(out)
	return out, err
}
