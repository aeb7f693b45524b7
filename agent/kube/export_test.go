package kube

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestExport(t *testing.T) {
	web := service("shop", "web", "10.96.0.10", port("http", 80, corev1.ProtocolTCP))
	webPorts := []*apiv1.ServicePort{sp("http", 80, "TCP")}
	tests := []struct {
		name   string
		se     *mcsv1a1.ServiceExport
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   *apiv1.ServiceExport
		// reason and message (a substring) when want is nil
		reason, message string
	}{
		{
			name:   "a ClusterSetIP service is exported with its ports and ready endpoints",
			se:     svcExport("shop", "web"),
			svc:    web,
			slices: []*discoveryv1.EndpointSlice{epSlice("shop", "web", "web-1", endpoint("10.1.0.2", yes, ""), endpoint("10.1.0.1", yes, ""))},
			want:   export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.1", true, ""), sep("10.1.0.2", true, "")),
		},
		{
			name: "a headless service is exported as Headless with its endpoints' hostnames",
			se:   svcExport("db", "pg"),
			svc:  service("db", "pg", corev1.ClusterIPNone, port("pg", 5432, corev1.ProtocolTCP)),
			slices: []*discoveryv1.EndpointSlice{epSlice("db", "pg", "pg-1",
				endpoint("10.1.0.7", yes, "pg-0"), endpoint("10.1.0.8", yes, "pg-1"))},
			want: export("db", "pg", "Headless", []*apiv1.ServicePort{sp("pg", 5432, "TCP")},
				sep("10.1.0.7", true, "pg-0"), sep("10.1.0.8", true, "pg-1")),
		},
		{
			name: "a named targetPort becomes the EndpointSlices' port of the same name",
			se:   svcExport("shop", "web"),
			svc: service("shop", "web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromString("web")}),
			slices: []*discoveryv1.EndpointSlice{withSlicePort(epSlice("shop", "web", "web-1", endpoint("10.1.0.1", yes, "")), "http", 8080)},
			want: export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", TargetPort: 8080}},
				sep("10.1.0.1", true, "")),
		},
		{
			name: "a numeric targetPort is the backend port before any slice exists",
			se:   svcExport("shop", "web"),
			svc: service("shop", "web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromInt32(9090)}),
			want: export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", TargetPort: 9090}}),
		},
		{
			name: "a headless service without ports is exported",
			se:   svcExport("db", "pg"),
			svc:  service("db", "pg", corev1.ClusterIPNone),
			want: export("db", "pg", "Headless", nil),
		},
		{
			name:   "an endpoint without a ready condition counts as ready and one whose ready is false does not",
			se:     svcExport("shop", "web"),
			svc:    web,
			slices: []*discoveryv1.EndpointSlice{epSlice("shop", "web", "web-1", endpoint("10.1.0.1", nil, ""), endpoint("10.1.0.2", no, ""))},
			want:   export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.1", true, ""), sep("10.1.0.2", false, "")),
		},
		{
			name: "the endpoints of two slices merge into one sorted list",
			se:   svcExport("shop", "web"),
			svc:  web,
			slices: []*discoveryv1.EndpointSlice{
				epSlice("shop", "web", "web-b", endpoint("10.1.0.3", yes, ""), endpoint("10.1.0.10", yes, "")),
				epSlice("shop", "web", "web-a", endpoint("10.1.0.2", yes, "")),
			},
			want: export("shop", "web", "ClusterSetIP", webPorts,
				sep("10.1.0.2", true, ""), sep("10.1.0.3", true, ""), sep("10.1.0.10", true, "")),
		},
		{
			name: "an address in two slices is one endpoint, ready when either copy is",
			se:   svcExport("shop", "web"),
			svc:  web,
			slices: []*discoveryv1.EndpointSlice{
				epSlice("shop", "web", "web-a", endpoint("10.1.0.2", no, ""), endpoint("10.1.0.3", no, "")),
				epSlice("shop", "web", "web-b", endpoint("10.1.0.2", yes, "web-2"), endpoint("10.1.0.3", no, "")),
			},
			want: export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.2", true, "web-2"), sep("10.1.0.3", false, "")),
		},
		{
			name: "slices of another service, another namespace or of FQDNs are ignored",
			se:   svcExport("shop", "web"),
			svc:  web,
			slices: []*discoveryv1.EndpointSlice{
				epSlice("shop", "web", "web-a", endpoint("10.1.0.2", yes, "")),
				epSlice("shop", "api", "api-a", endpoint("10.1.0.3", yes, "")),
				epSlice("other", "web", "web-a", endpoint("10.1.0.4", yes, "")),
				func() *discoveryv1.EndpointSlice {
					s := epSlice("shop", "web", "web-fqdn", endpoint("example.com", yes, ""))
					s.AddressType = discoveryv1.AddressTypeFQDN
					return s
				}(),
			},
			want: export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.2", true, "")),
		},
		{
			name: "only the first address of an endpoint is a backend, as kube-proxy has it",
			se:   svcExport("shop", "web"),
			svc:  web,
			slices: []*discoveryv1.EndpointSlice{epSlice("shop", "web", "web-a",
				discoveryv1.Endpoint{Addresses: []string{"10.1.0.2", "10.1.0.9"}}, discoveryv1.Endpoint{})},
			want: export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.2", true, "")),
		},
		{
			name: "an IPv6 slice beside an IPv4 one gives both families' endpoints",
			se:   svcExport("shop", "web"),
			svc:  web,
			slices: []*discoveryv1.EndpointSlice{
				epSlice("shop", "web", "web-4", endpoint("10.1.0.2", yes, "")),
				func() *discoveryv1.EndpointSlice {
					s := epSlice("shop", "web", "web-6", endpoint("fd00::2", yes, ""))
					s.AddressType = discoveryv1.AddressTypeIPv6
					return s
				}(),
			},
			want: export("shop", "web", "ClusterSetIP", webPorts, sep("10.1.0.2", true, ""), sep("fd00::2", true, "")),
		},
		{
			name: "ports keep their names and protocols",
			se:   svcExport("dns", "coredns"),
			svc: service("dns", "coredns", "10.96.0.53",
				port("dns", 53, corev1.ProtocolUDP), port("dns-tcp", 53, corev1.ProtocolTCP), port("sig", 9000, corev1.ProtocolSCTP)),
			want: export("dns", "coredns", "ClusterSetIP", []*apiv1.ServicePort{sp("dns", 53, "UDP"), sp("dns-tcp", 53, "TCP"), sp("sig", 9000, "SCTP")}),
		},
		{
			name: "a port without a protocol is TCP",
			se:   svcExport("shop", "web"),
			svc:  service("shop", "web", "10.96.0.10", port("", 80, "")),
			want: export("shop", "web", "ClusterSetIP", []*apiv1.ServicePort{sp("", 80, "TCP")}),
		},
		{
			name: "labels come from the ServiceExport, its exportedLabels over its metadata labels",
			se:   svcExport("shop", "web", withLabels("tier", "front", "env", "dev"), withExportedLabels("env", "prod")),
			svc:  web,
			want: func() *apiv1.ServiceExport {
				e := export("shop", "web", "ClusterSetIP", webPorts)
				e.Labels = map[string]string{"tier": "front", "env": "prod", "cablemesh.io/exported": "true"}
				return e
			}(),
		},
		{
			name: "an exported label the ServiceExport sets itself is kept",
			se:   svcExport("shop", "web", withLabels("cablemesh.io/exported", "false")),
			svc:  web,
			want: func() *apiv1.ServiceExport {
				e := export("shop", "web", "ClusterSetIP", webPorts)
				e.Labels = map[string]string{"cablemesh.io/exported": "false"}
				return e
			}(),
		},
		{
			name: "the affinity annotation none is carried",
			se:   svcExport("shop", "web", withAffinity("none")),
			svc:  web,
			want: func() *apiv1.ServiceExport {
				e := export("shop", "web", "ClusterSetIP", webPorts)
				e.Affinity = "none"
				return e
			}(),
		},
		{
			name: "the affinity annotation local is carried",
			se:   svcExport("shop", "web", withAffinity("local")),
			svc:  web,
			want: export("shop", "web", "ClusterSetIP", webPorts),
		},
		{
			name:    "a ServiceExport without a Service is not valid for NoService",
			se:      svcExport("shop", "web"),
			reason:  ReasonNoService,
			message: "Service shop/web not found",
		},
		{
			name:    "an ExternalName Service is not valid for InvalidServiceType",
			se:      svcExport("shop", "web"),
			svc:     &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}},
			reason:  ReasonInvalidServiceType,
			message: "is of type ExternalName",
		},
		{
			name:    "an affinity annotation that is neither local nor none is not valid, named in the message",
			se:      svcExport("shop", "web", withAffinity("sticky")),
			svc:     web,
			reason:  ReasonInvalidExport,
			message: `annotation cablemesh.io/affinity: "sticky" is not local or none`,
		},
		{
			name:    "a ClusterSetIP service without ports is refused by mcs.Normalize",
			se:      svcExport("shop", "web"),
			svc:     service("shop", "web", "10.96.0.10"),
			reason:  ReasonInvalidExport,
			message: "export.ports: a ClusterSetIP service needs at least one port",
		},
		{
			name:    "an address that is no IP is refused by mcs.Normalize, by name",
			se:      svcExport("shop", "web"),
			svc:     web,
			slices:  []*discoveryv1.EndpointSlice{epSlice("shop", "web", "web-a", endpoint("10.1.0.300", yes, ""))},
			reason:  ReasonInvalidExport,
			message: `"10.1.0.300" is not a unicast IP address`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			se, svc := tt.se.DeepCopy(), tt.svc.DeepCopy()
			var slices []*discoveryv1.EndpointSlice
			for _, s := range tt.slices {
				slices = append(slices, s.DeepCopy())
			}
			got, v := Export("east", tt.se, tt.svc, tt.slices)
			if tt.want != nil {
				if !v.Valid || v.Reason != ReasonValid || !proto.Equal(got, tt.want) {
					t.Fatalf("Export = %s, %+v\nwant %s valid", show(got), v, show(tt.want))
				}
			} else if got != nil || v.Valid || v.Reason != tt.reason || !strings.Contains(v.Message, tt.message) {
				t.Fatalf("Export = %s, %+v\nwant no export, reason %s, message with %q", show(got), v, tt.reason, tt.message)
			}
			if !equality.Semantic.DeepEqual(se, tt.se) || !equality.Semantic.DeepEqual(svc, tt.svc) ||
				!equality.Semantic.DeepEqual(slices, tt.slices) {
				t.Error("Export changed its arguments")
			}
		})
	}
}

func TestValidCondition(t *testing.T) {
	se := svcExport("shop", "web")
	se.Generation = 3
	want := validCondition(Validity{Reason: ReasonNoService, Message: "Service shop/web not found"}, se.Generation)
	if hasCondition(se, want) {
		t.Fatal("a ServiceExport without conditions has the condition")
	}
	withIt := withCondition(se, want)
	if len(se.Status.Conditions) != 0 {
		t.Fatal("withCondition changed its argument")
	}
	if !hasCondition(withIt, want) {
		t.Fatalf("withCondition: conditions %+v lack %+v", withIt.Status.Conditions, want)
	}
	c := withIt.Status.Conditions[0]
	if c.Type != "Valid" || c.Status != "False" || c.ObservedGeneration != 3 || c.LastTransitionTime.IsZero() {
		t.Fatalf("condition = %+v", c)
	}
	again := withCondition(withIt, validCondition(Validity{Reason: ReasonNoService, Message: "other"}, 3))
	if !again.Status.Conditions[0].LastTransitionTime.Equal(&c.LastTransitionTime) {
		t.Error("the transition time moved though the status did not")
	}
	valid := validCondition(Validity{Valid: true, Reason: ReasonValid, Message: "exported as ClusterSetIP"}, 3)
	if hasCondition(withIt, valid) {
		t.Error("a False condition passes for a True one")
	}
}
