package kube

import (
	"fmt"

	"google.golang.org/protobuf/encoding/prototext"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Builders of the Kubernetes objects the tests feed the Watcher and Export.

func svcExport(ns, name string, mods ...func(*mcsv1a1.ServiceExport)) *mcsv1a1.ServiceExport {
	se := &mcsv1a1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, m := range mods {
		m(se)
	}
	return se
}

func withLabels(kv ...string) func(*mcsv1a1.ServiceExport) {
	return func(se *mcsv1a1.ServiceExport) { se.Labels = pairs(kv) }
}

func withExportedLabels(kv ...string) func(*mcsv1a1.ServiceExport) {
	return func(se *mcsv1a1.ServiceExport) { se.Spec.ExportedLabels = pairs(kv) }
}

func withAffinity(a string) func(*mcsv1a1.ServiceExport) {
	return func(se *mcsv1a1.ServiceExport) { se.Annotations = map[string]string{AnnotationAffinity: a} }
}

func pairs(kv []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// service is a ClusterIP Service; clusterIP "None" makes it headless.
func service(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, Ports: ports},
	}
}

func port(name string, p int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: p, Protocol: proto}
}

func epSlice(ns, svc, name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
	}
}

// endpoint is one endpoint of ip; ready nil leaves conditions.ready unset; hostname "" leaves it
// unset.
func endpoint(ip string, ready *bool, hostname string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	if hostname != "" {
		ep.Hostname = &hostname
	}
	return ep
}

var (
	yes = ptr(true)
	no  = ptr(false)
)

func ptr[T any](v T) *T { return &v }

// Builders of the exports the tests expect.

func export(ns, name, typ string, ports []*apiv1.ServicePort, eps ...*apiv1.ServiceEndpoint) *apiv1.ServiceExport {
	return &apiv1.ServiceExport{
		Cluster: "east", Namespace: ns, Name: name, Type: typ, Affinity: "local",
		Labels: map[string]string{"cablemesh.io/exported": "true"},
		Ports:  ports, Endpoints: eps,
	}
}

func sp(name string, p uint32, proto string) *apiv1.ServicePort {
	return &apiv1.ServicePort{Name: name, Port: p, Protocol: proto}
}

func sep(ip string, ready bool, hostname string) *apiv1.ServiceEndpoint {
	return &apiv1.ServiceEndpoint{Ip: ip, Ready: ready, Hostname: hostname}
}

func show(es ...*apiv1.ServiceExport) string {
	s := ""
	for _, e := range es {
		s += fmt.Sprintf("{%s}\n", prototext.MarshalOptions{}.Format(e))
	}
	if s == "" {
		return "(none)"
	}
	return s
}

// withSlicePort gives a slice the named port its endpoints listen on.
func withSlicePort(s *discoveryv1.EndpointSlice, name string, port int32) *discoveryv1.EndpointSlice {
	proto := corev1.ProtocolTCP
	s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	return s
}
