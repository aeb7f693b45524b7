package mcsimport

import (
	"context"
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// fakeAPI is an in-memory API server: objects keyed namespace/name, resource versions checked
// on update (Conflict) as the API server does, and a count of writes.
type fakeAPI struct {
	mu         sync.Mutex
	namespaces map[string]bool
	imports    map[string]*mcsv1a1.ServiceImport
	slices     map[string]*discoveryv1.EndpointSlice
	leases     map[string]*coordinationv1.Lease
	rv         int
	writes     int // ServiceImport and EndpointSlice writes
}

func newFakeAPI(namespaces ...string) *fakeAPI {
	f := &fakeAPI{namespaces: map[string]bool{}, imports: map[string]*mcsv1a1.ServiceImport{},
		slices: map[string]*discoveryv1.EndpointSlice{}, leases: map[string]*coordinationv1.Lease{}}
	for _, ns := range namespaces {
		f.namespaces[ns] = true
	}
	return f
}

var (
	grSI    = schema.GroupResource{Group: "multicluster.x-k8s.io", Resource: "serviceimports"}
	grES    = schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}
	grLease = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
)

func (f *fakeAPI) nextRV() string { f.rv++; return strconv.Itoa(f.rv) }

func matches(selector string, l map[string]string) bool {
	s, err := labels.Parse(selector)
	return err == nil && s.Matches(labels.Set(l))
}

// namespaceGone is the API server's answer to a create in a namespace that does not exist.
func (f *fakeAPI) namespaceGone(ns string) error {
	if f.namespaces[ns] {
		return nil
	}
	return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns)
}

func (f *fakeAPI) ListServiceImports(_ context.Context, selector string) ([]mcsv1a1.ServiceImport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []mcsv1a1.ServiceImport
	for _, si := range f.imports {
		if matches(selector, si.Labels) {
			out = append(out, *si.DeepCopy())
		}
	}
	return out, nil
}

func (f *fakeAPI) CreateServiceImport(_ context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.namespaceGone(si.Namespace); err != nil {
		return nil, err
	}
	k := key(si.Namespace, si.Name)
	if _, ok := f.imports[k]; ok {
		return nil, apierrors.NewAlreadyExists(grSI, si.Name)
	}
	c := si.DeepCopy()
	c.Status = mcsv1a1.ServiceImportStatus{} // the status subresource: create ignores it
	c.ResourceVersion = f.nextRV()
	f.imports[k] = c
	f.writes++
	return c.DeepCopy(), nil
}

func (f *fakeAPI) UpdateServiceImport(_ context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := key(si.Namespace, si.Name)
	cur, ok := f.imports[k]
	if !ok {
		return nil, apierrors.NewNotFound(grSI, si.Name)
	}
	if cur.ResourceVersion != si.ResourceVersion {
		return nil, apierrors.NewConflict(grSI, si.Name, nil)
	}
	c := si.DeepCopy()
	c.Status = cur.Status
	c.ResourceVersion = f.nextRV()
	f.imports[k] = c
	f.writes++
	return c.DeepCopy(), nil
}

func (f *fakeAPI) UpdateServiceImportStatus(_ context.Context, si *mcsv1a1.ServiceImport) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := key(si.Namespace, si.Name)
	cur, ok := f.imports[k]
	if !ok {
		return apierrors.NewNotFound(grSI, si.Name)
	}
	if cur.ResourceVersion != si.ResourceVersion {
		return apierrors.NewConflict(grSI, si.Name, nil)
	}
	cur.Status = *si.Status.DeepCopy()
	cur.ResourceVersion = f.nextRV()
	f.writes++
	return nil
}

func (f *fakeAPI) DeleteServiceImport(_ context.Context, ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.imports[key(ns, name)]; !ok {
		return apierrors.NewNotFound(grSI, name)
	}
	delete(f.imports, key(ns, name))
	f.writes++
	return nil
}

func (f *fakeAPI) ListEndpointSlices(_ context.Context, selector string) ([]discoveryv1.EndpointSlice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []discoveryv1.EndpointSlice
	for _, es := range f.slices {
		if matches(selector, es.Labels) {
			out = append(out, *es.DeepCopy())
		}
	}
	return out, nil
}

func (f *fakeAPI) CreateEndpointSlice(_ context.Context, es *discoveryv1.EndpointSlice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.namespaceGone(es.Namespace); err != nil {
		return err
	}
	k := key(es.Namespace, es.Name)
	if _, ok := f.slices[k]; ok {
		return apierrors.NewAlreadyExists(grES, es.Name)
	}
	c := es.DeepCopy()
	c.ResourceVersion = f.nextRV()
	f.slices[k] = c
	f.writes++
	return nil
}

func (f *fakeAPI) UpdateEndpointSlice(_ context.Context, es *discoveryv1.EndpointSlice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := key(es.Namespace, es.Name)
	cur, ok := f.slices[k]
	if !ok {
		return apierrors.NewNotFound(grES, es.Name)
	}
	if cur.ResourceVersion != es.ResourceVersion {
		return apierrors.NewConflict(grES, es.Name, nil)
	}
	c := es.DeepCopy()
	c.ResourceVersion = f.nextRV()
	f.slices[k] = c
	f.writes++
	return nil
}

func (f *fakeAPI) DeleteEndpointSlice(_ context.Context, ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.slices[key(ns, name)]; !ok {
		return apierrors.NewNotFound(grES, name)
	}
	delete(f.slices, key(ns, name))
	f.writes++
	return nil
}

func (f *fakeAPI) GetLease(_ context.Context, ns, name string) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[key(ns, name)]
	if !ok {
		return nil, apierrors.NewNotFound(grLease, name)
	}
	return l.DeepCopy(), nil
}

func (f *fakeAPI) CreateLease(_ context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := key(l.Namespace, l.Name)
	if _, ok := f.leases[k]; ok {
		return nil, apierrors.NewAlreadyExists(grLease, l.Name)
	}
	c := l.DeepCopy()
	c.ResourceVersion = f.nextRV()
	f.leases[k] = c
	return c.DeepCopy(), nil
}

func (f *fakeAPI) UpdateLease(_ context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := key(l.Namespace, l.Name)
	cur, ok := f.leases[k]
	if !ok {
		return nil, apierrors.NewNotFound(grLease, l.Name)
	}
	if cur.ResourceVersion != l.ResourceVersion {
		return nil, apierrors.NewConflict(grLease, l.Name, nil)
	}
	c := l.DeepCopy()
	c.ResourceVersion = f.nextRV()
	f.leases[k] = c
	return c.DeepCopy(), nil
}

func (f *fakeAPI) holder() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.leases[key("cablemesh", LeaseName)]
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}
