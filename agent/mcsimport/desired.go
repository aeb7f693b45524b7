// Package mcsimport writes, in the importing cluster, the MCS API objects of what it imports
// from the broker (KEP-1645, as Submariner Lighthouse and Cilium do): a ServiceImport per
// imported service in the service's namespace, and an EndpointSlice per source cluster holding
// that cluster's endpoints. One writer per cluster (a coordination.k8s.io Lease among the
// gateway agents) reconciles the objects labelled as Cablemesh's against the broker's imports;
// it never touches an object without that label.
package mcsimport

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The labels of the objects the writer makes. ManagedByLabel=ManagedBy marks them as
// Cablemesh's: the writer lists, updates and deletes only objects carrying it.
const (
	ManagedByLabel     = "endpointslice.kubernetes.io/managed-by"
	ManagedBy          = "cablemesh.io"
	ServiceNameLabel   = "multicluster.kubernetes.io/service-name"
	SourceClusterLabel = "multicluster.kubernetes.io/source-cluster"
	// maxEndpointsPerSlice is the EndpointSlice API's limit.
	maxEndpointsPerSlice = 1000
)

// managedSelector selects the objects the writer owns.
var managedSelector = ManagedByLabel + "=" + ManagedBy

// desired is what the cluster's API should hold for the imports: ServiceImports keyed
// namespace/name and EndpointSlices keyed namespace/name.
type desired struct {
	imports map[string]*mcsv1a1.ServiceImport
	slices  map[string]*discoveryv1.EndpointSlice
}

func key(ns, name string) string { return ns + "/" + name }

// buildDesired is the objects of imps.
func buildDesired(imps []*apiv1.ServiceImport) desired {
	d := desired{imports: map[string]*mcsv1a1.ServiceImport{}, slices: map[string]*discoveryv1.EndpointSlice{}}
	for _, imp := range imps {
		if imp.GetNamespace() == "" || imp.GetName() == "" {
			continue
		}
		si := serviceImport(imp)
		d.imports[key(si.Namespace, si.Name)] = si
		for _, c := range imp.GetClusters() {
			for _, es := range endpointSlices(imp, c) {
				d.slices[key(es.Namespace, es.Name)] = es
			}
		}
	}
	return d
}

func managedLabels(service string) map[string]string {
	return map[string]string{ManagedByLabel: ManagedBy, ServiceNameLabel: service}
}

// serviceImport is the MCS ServiceImport of imp.
func serviceImport(imp *apiv1.ServiceImport) *mcsv1a1.ServiceImport {
	si := &mcsv1a1.ServiceImport{
		TypeMeta:   metav1.TypeMeta{APIVersion: mcsv1a1.SchemeGroupVersion.String(), Kind: "ServiceImport"},
		ObjectMeta: metav1.ObjectMeta{Namespace: imp.GetNamespace(), Name: imp.GetName(), Labels: managedLabels(imp.GetName())},
		Spec: mcsv1a1.ServiceImportSpec{
			Type: mcsv1a1.ClusterSetIP,
			// Cablemesh's affinity (local cluster first) is no client affinity: MCS's None.
			SessionAffinity: corev1.ServiceAffinityNone,
			Ports:           []mcsv1a1.ServicePort{},
		},
	}
	if imp.GetType() == string(mcsv1a1.Headless) {
		si.Spec.Type = mcsv1a1.Headless
	} else {
		si.Spec.IPs = slices.Clone(imp.GetVips())
	}
	for _, p := range imp.GetPorts() {
		si.Spec.Ports = append(si.Spec.Ports, mcsv1a1.ServicePort{Name: p.GetName(), Protocol: protocol(p.GetProtocol()), Port: int32(p.GetPort())})
	}
	for _, c := range imp.GetClusters() {
		si.Status.Clusters = append(si.Status.Clusters, mcsv1a1.ClusterStatus{Cluster: c.GetCluster()})
	}
	slices.SortFunc(si.Status.Clusters, func(a, b mcsv1a1.ClusterStatus) int { return strings.Compare(a.Cluster, b.Cluster) })
	return si
}

func protocol(p string) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return corev1.Protocol(strings.ToUpper(p))
}

// endpointSlices are the EndpointSlices of cluster c's endpoints of imp: one per address
// family that has endpoints (an EndpointSlice holds one family), none when the broker sent no
// endpoints.
func endpointSlices(imp *apiv1.ServiceImport, c *apiv1.ImportedCluster) []*discoveryv1.EndpointSlice {
	byFamily := map[discoveryv1.AddressType][]discoveryv1.Endpoint{}
	for _, ep := range c.GetEndpoints() {
		a, err := netip.ParseAddr(ep.GetIp())
		if err != nil {
			continue
		}
		fam := discoveryv1.AddressTypeIPv4
		if a.Unmap().Is6() {
			fam = discoveryv1.AddressTypeIPv6
		}
		if len(byFamily[fam]) >= maxEndpointsPerSlice {
			continue
		}
		ready := ep.GetReady()
		e := discoveryv1.Endpoint{Addresses: []string{a.Unmap().String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		if h := ep.GetHostname(); h != "" {
			e.Hostname = &h
		}
		byFamily[fam] = append(byFamily[fam], e)
	}
	ports := c.GetPorts()
	if len(ports) == 0 {
		ports = imp.GetPorts()
	}
	var out []*discoveryv1.EndpointSlice
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		eps := byFamily[fam]
		if len(eps) == 0 {
			continue
		}
		slices.SortFunc(eps, func(a, b discoveryv1.Endpoint) int { return strings.Compare(a.Addresses[0], b.Addresses[0]) })
		labels := managedLabels(imp.GetName())
		labels[SourceClusterLabel] = c.GetCluster()
		es := &discoveryv1.EndpointSlice{
			TypeMeta:    metav1.TypeMeta{APIVersion: discoveryv1.SchemeGroupVersion.String(), Kind: "EndpointSlice"},
			ObjectMeta:  metav1.ObjectMeta{Namespace: imp.GetNamespace(), Name: sliceName(imp.GetName(), c.GetCluster(), fam), Labels: labels},
			AddressType: fam,
			Endpoints:   eps,
			Ports:       []discoveryv1.EndpointPort{},
		}
		for _, p := range ports {
			name, proto := p.GetName(), protocol(p.GetProtocol())
			port := int32(p.GetTargetPort())
			if port == 0 {
				port = int32(p.GetPort())
			}
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		out = append(out, es)
	}
	return out
}

// sliceName is the EndpointSlice of service's endpoints in cluster, of family fam: a DNS
// subdomain name of at most 63 characters, made unique by a hash when it must be shortened.
func sliceName(service, cluster string, fam discoveryv1.AddressType) string {
	name := service + "-" + cluster
	if fam == discoveryv1.AddressTypeIPv6 {
		name += "-ipv6"
	}
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return strings.TrimRight(name[:50], "-.") + "-" + hex.EncodeToString(sum[:])[:12]
}
