// Package kube turns the Kubernetes objects of one cluster into Cablemesh exports, in the manner
// of Submariner Lighthouse's agent and the Kubernetes MCS API (sigs.k8s.io/mcs-api, KEP-1645).
//
// A ServiceExport (multicluster.x-k8s.io/v1alpha1) exports the Service of the same namespace and
// name. For each one whose Service exists, the Watcher builds one *apiv1.ServiceExport: type
// Headless when the Service's clusterIP is None and ClusterSetIP otherwise, the Service's named
// ports, the ServiceExport's labels, the affinity of its cablemesh.io/affinity annotation, and the
// endpoints of the Service's EndpointSlices. Every export goes through mcs.Normalize; one it
// refuses is left out.
//
// The package is a pure core and a thin shell. Export (export.go) decides what one ServiceExport
// comes to, an export or the reason it has none, from the objects alone. The Watcher (watcher.go)
// keeps informers over ServiceExports, Services and EndpointSlices, recomputes the whole export set
// after every burst of changes, hands it to its caller, and writes the MCS Valid condition back on
// each ServiceExport when it changes.
//
// The informers list, watch and write through a Client (client.go): NewClient's is a REST client
// whose scheme holds only the types the agent reads (core/v1, discovery/v1, mcs v1alpha1), so the
// agent does not link client-go's clientset and informer factories, which register every API
// group of Kubernetes. Tests adapt the fake clientsets to it (kubetest.Clientsets).
package kube
