package kube

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/cablemesh/cablemesh/mcs"
)

// serviceIndex indexes EndpointSlices by the namespace/name of the Service they belong to.
const serviceIndex = "service"

// namespaceIndexers are the indexers of client-go's generated informers (a new map each time: an
// informer's indexer keeps the map it is given).
func namespaceIndexers() cache.Indexers {
	return cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
}

// newServiceExportInformer is an informer over the ServiceExports of every namespace.
func newServiceExportInformer(c Client, resync time.Duration) cache.SharedIndexInformer {
	return newInformer(c, c.ServiceExports(), &mcsv1a1.ServiceExport{}, resync, namespaceIndexers(), nil)
}

// newServiceInformer is an informer over the Services of every namespace.
func newServiceInformer(c Client, resync time.Duration) cache.SharedIndexInformer {
	return newInformer(c, c.Services(), &corev1.Service{}, resync, namespaceIndexers(), nil)
}

// newEndpointSliceInformer is an informer over the EndpointSlices that belong to a Service (those
// labelled kubernetes.io/service-name, as every slice the EndpointSlice controller writes is),
// indexed by that Service.
func newEndpointSliceInformer(c Client, resync time.Duration) cache.SharedIndexInformer {
	return newInformer(c, c.EndpointSlices(), &discoveryv1.EndpointSlice{}, resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, serviceIndex: sliceService},
		func(opts *metav1.ListOptions) { opts.LabelSelector = discoveryv1.LabelServiceName })
}

// sliceService is the index function of serviceIndex.
func sliceService(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, fmt.Errorf("index %s: %T is not an EndpointSlice", serviceIndex, obj)
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{mcs.Key(s.Namespace, name)}, nil
}
