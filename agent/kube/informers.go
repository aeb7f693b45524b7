package kube

import (
	"context"
	"fmt"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsclient "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned"

	"github.com/cablemesh/cablemesh/mcs"
)

// serviceIndex indexes EndpointSlices by the namespace/name of the Service they belong to.
const serviceIndex = "service"

// newServiceExportInformer is an informer over the ServiceExports of every namespace.
//
// It is built here rather than taken from the mcs-api informer factory: that factory's generated
// code predates client-go's WatchList semantics check, so with client-go >= 1.35 (WatchListClient
// on by default) its informers ask every client, fakes included, for a streaming list and wait
// forever on one that cannot give it. ToListWatcherWithWatchListSemantics asks the client, as
// client-go's own informers do.
func newServiceExportInformer(client mcsclient.Interface, resync time.Duration) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return client.MulticlusterV1alpha1().ServiceExports(metav1.NamespaceAll).List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.MulticlusterV1alpha1().ServiceExports(metav1.NamespaceAll).Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&mcsv1a1.ServiceExport{}, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// newEndpointSliceInformer is an informer over the EndpointSlices that belong to a Service (those
// labelled kubernetes.io/service-name, as every slice the EndpointSlice controller writes is),
// indexed by that Service.
func newEndpointSliceInformer(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
	return discoveryinformers.NewFilteredEndpointSliceInformer(client, metav1.NamespaceAll, resync,
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
