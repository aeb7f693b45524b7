package dashboard

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/policy"
)

// fakeBroker answers the admin reads from fields a test sets; it counts the calls.
type fakeBroker struct {
	mu       sync.Mutex
	clusters *apiv1.ListClustersResponse
	policies *apiv1.ListPoliciesResponse
	services *apiv1.ListServicesResponse
	certs    *apiv1.ListCertificatesResponse
	links    []Link
	err      error
	calls    int
}

func (f *fakeBroker) ListClusters(context.Context, *apiv1.ListClustersRequest, ...grpc.CallOption) (*apiv1.ListClustersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return proto.Clone(f.clusters).(*apiv1.ListClustersResponse), nil
}

func (f *fakeBroker) ListPolicies(context.Context, *apiv1.ListPoliciesRequest, ...grpc.CallOption) (*apiv1.ListPoliciesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return proto.Clone(f.policies).(*apiv1.ListPoliciesResponse), f.err
}

func (f *fakeBroker) ListServices(context.Context, *apiv1.ListServicesRequest, ...grpc.CallOption) (*apiv1.ListServicesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return proto.Clone(f.services).(*apiv1.ListServicesResponse), f.err
}

func (f *fakeBroker) ListCertificates(context.Context, *apiv1.ListCertificatesRequest, ...grpc.CallOption) (*apiv1.ListCertificatesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return proto.Clone(f.certs).(*apiv1.ListCertificatesResponse), f.err
}

func (f *fakeBroker) Links(context.Context) ([]Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Link(nil), f.links...), nil
}

// update changes the fake's state under its lock and bumps the store revision.
func (f *fakeBroker) update(fn func(f *fakeBroker)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
	f.clusters.Revision++
}

var t0 = time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)

func fptr(v float64) *float64 { return &v }

// threeClusters is a mesh of east, west and north, one gateway each, connected by the default
// policy over wireguard, with a mesh policy that keeps north and west apart at priority 5; west
// exports shop/web; every pair has a link report with both ends connected.
func threeClusters(t *testing.T) *fakeBroker {
	t.Helper()
	lease := timestamppb.New(t0.Add(30 * time.Second))
	f := &fakeBroker{
		clusters: &apiv1.ListClustersResponse{Revision: 10},
		services: &apiv1.ListServicesResponse{Imports: []*apiv1.ServiceImport{{
			Namespace: "shop", Name: "web", Type: "ClusterSetIP", Vips: []string{"241.0.0.1"},
			Ports:     []*apiv1.ServicePort{{Name: "http", Port: 8080, Protocol: "TCP"}},
			Clusters:  []*apiv1.ImportedCluster{{Cluster: "west", Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.2.0.5", Ready: true}, {Ip: "10.2.0.6"}}}},
			Conflicts: []*apiv1.ServiceConflict{{Cluster: "east", Field: "ports", Message: "port 8080 is UDP in east"}},
		}}},
		certs: &apiv1.ListCertificatesResponse{
			Cas:   []*apiv1.CAInfo{{Hash: "sha256:aa", NotAfter: timestamppb.New(t0.Add(3650 * 24 * time.Hour)), Issuing: true, Serving: true}},
			Admin: &apiv1.IssuedCertificate{Serial: "01", NotAfter: timestamppb.New(t0.Add(300 * 24 * time.Hour))},
		},
	}
	for i, spec := range []struct{ name, zone string }{{"east", "east"}, {"west", "west"}, {"north", "north"}} {
		f.clusters.Clusters = append(f.clusters.Clusters, &apiv1.Cluster{Name: spec.name, Id: uint32(i + 1), Labels: map[string]string{"zone": spec.zone}, Revision: 1})
		f.clusters.Endpoints = append(f.clusters.Endpoints, &apiv1.Endpoint{Cluster: spec.name, Node: "gw1", PrivateIp: "172.31.0." + string(rune('2'+i)), MeshAddress: "242.0.0." + string(rune('1'+i)), LeaseExpires: lease})
		notAfter := t0.Add(300 * 24 * time.Hour)
		if spec.name == "north" {
			notAfter = t0.Add(5 * 24 * time.Hour) // due for a warning
		}
		f.certs.Nodes = append(f.certs.Nodes, &apiv1.NodeCertificate{Cluster: spec.name, Node: "gw1", MeshAddress: "242.0.0.9",
			Certificates: []*apiv1.IssuedCertificate{{Serial: "0" + spec.name, NotAfter: timestamppb.New(notAfter), IssuerCa: "sha256:aa"}}})
	}
	def, _, err := admission.DefaultPolicy("wireguard")
	if err != nil {
		t.Fatal(err)
	}
	prio := 5
	apart := policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "west-north-apart"}, Spec: policy.Spec{
		LeftClusterSelector:  &policy.Selector{MatchLabels: map[string]string{"zone": "west"}},
		RightClusterSelector: &policy.Selector{MatchLabels: map[string]string{"zone": "north"}},
		ConnectionPolicy:     policy.NoConnect, Priority: &prio}}
	_, b, err := admission.CanonicalPolicy(apart, policy.OriginMesh)
	if err != nil {
		t.Fatal(err)
	}
	f.policies = &apiv1.ListPoliciesResponse{Policies: []*apiv1.Policy{def, {Name: "west-north-apart", Json: b, Revision: 3,
		StatusJson: []byte(`{"pairsDecided":1,"pairsConnected":0,"conflictsLost":0}`)}}}
	rep := t0.Add(-2 * time.Second)
	end := func(cluster string) LinkEnd {
		return LinkEnd{Cluster: cluster, Node: "gw1", State: "connected", Driver: "wireguard", Policy: def.Name,
			LatencyP50Ms: fptr(0.4), LatencyP95Ms: fptr(0.7), LatencyP99Ms: fptr(0.9), ReportedAt: &rep, AgentVersion: "v0.9.0"}
	}
	f.links = []Link{{Clusters: [2]string{"east", "west"}, Ends: []LinkEnd{end("east"), end("west")}, Agree: true},
		{Clusters: [2]string{"east", "north"}, Ends: []LinkEnd{end("east"), end("north")}, Agree: true}}
	return f
}

func newTestPoller(f *fakeBroker) *Poller {
	return NewPoller(f, f.Links, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
}
