package broker

import (
	"encoding/json"
	"testing"

	"google.golang.org/grpc/codes"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

// clusterPolicy is what an agent of cluster sends for its policy name: vxlan between the
// cluster and every other, labelled and named as policy.ClusterScoped makes it.
func clusterPolicy(t *testing.T, name, cluster string) *apiv1.Policy {
	t.Helper()
	prio := 0
	p := policy.ClusterConnectionPolicy{Kind: policy.Kind,
		Metadata: policy.ObjectMeta{Name: name, Labels: map[string]string{policy.LabelOrigin: policy.OriginClusterLabel}},
		Spec:     policy.Spec{ClusterSelector: &policy.Selector{}, Priority: &prio, CableDriver: &policy.CableDriver{Name: "vxlan"}}}
	synced, err := policy.ClusterScoped(p, cluster)
	if err != nil {
		t.Fatal(err)
	}
	return policyRecord(t, synced)
}

func policyRecord(t *testing.T, p policy.ClusterConnectionPolicy) *apiv1.Policy {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &apiv1.Policy{Name: p.Metadata.Name, Json: b}
}

func listedPolicies(t *testing.T, b *testBroker) map[string]policy.ClusterConnectionPolicy {
	t.Helper()
	resp, err := b.admin.ListPolicies(ctxT(t), &apiv1.ListPoliciesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]policy.ClusterConnectionPolicy{}
	for _, sp := range resp.Policies {
		var p policy.ClusterConnectionPolicy
		if err := json.Unmarshal(sp.Json, &p); err != nil {
			t.Fatal(err)
		}
		out[sp.Name] = p
	}
	return out
}

func TestANodeSetsItsClusterPoliciesAndTheyReachOtherClusters(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	west := mustJoin(t, b.addr, b.token("west", "10.2.0.0/16"), "west", "gw1").client(t, b.addr)

	rec := clusterPolicy(t, "to-west", "east")
	resp, err := east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{rec}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Outcomes) != 1 || resp.Outcomes[0] != "created" {
		t.Fatalf("outcomes %v", resp.Outcomes)
	}
	got := listedPolicies(t, b)[rec.Name]
	if got.Origin != "east" || got.Metadata.Labels[policy.LabelCluster] != "east" || got.OriginString() != "cluster/east" {
		t.Fatalf("stored %+v", got)
	}

	// The other cluster's agent receives it through the watch: the copy it resolves with.
	w, err := west.Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range recv(t, w).Events {
		if p := ev.GetResource().GetPolicy(); p != nil && p.Name == rec.Name {
			found = true
		}
	}
	if !found {
		t.Fatalf("west's snapshot has no %s", rec.Name)
	}

	// The same set again writes nothing; an empty set deletes the cluster's policies.
	resp, err = east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{rec}})
	if err != nil || resp.Outcomes[0] != "unchanged" {
		t.Fatalf("second set: %v %v", resp, err)
	}
	resp, err = east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{})
	if err != nil || len(resp.Deleted) != 1 || resp.Deleted[0] != rec.Name {
		t.Fatalf("empty set: %v %v", resp, err)
	}
	if _, ok := listedPolicies(t, b)[rec.Name]; ok {
		t.Fatal("the deleted policy is still listed")
	}
}

func TestANodeCannotWriteAnotherClustersOrAMeshPolicy(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	west := mustJoin(t, b.addr, b.token("west", "10.2.0.0/16"), "west", "gw1").client(t, b.addr)
	westRec := clusterPolicy(t, "mine", "west")
	if _, err := west.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{westRec}}); err != nil {
		t.Fatal(err)
	}

	// west's policy, sent by east as it is.
	_, err := east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{westRec}})
	wantCode(t, err, codes.InvalidArgument, "metadata.labels."+policy.LabelCluster, `"west", want "east"`)

	// A policy without the origin label: a mesh policy, which only the admin writes.
	var mesh policy.ClusterConnectionPolicy
	if err := json.Unmarshal(clusterPolicy(t, "x", "east").Json, &mesh); err != nil {
		t.Fatal(err)
	}
	delete(mesh.Metadata.Labels, policy.LabelOrigin)
	_, err = east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{policyRecord(t, mesh)}})
	wantCode(t, err, codes.InvalidArgument, "a node writes only cluster-scoped policies")

	// east's labels on a name that is not east's naming (here: the mesh default's name).
	var named policy.ClusterConnectionPolicy
	if err := json.Unmarshal(clusterPolicy(t, "x", "east").Json, &named); err != nil {
		t.Fatal(err)
	}
	named.Metadata.Name = policy.DefaultPolicyName
	_, err = east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{policyRecord(t, named)}})
	wantCode(t, err, codes.InvalidArgument, "metadata.name", `is not a name of cluster "east"'s policies`)

	// east's empty set leaves west's policy alone.
	if _, err := east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := listedPolicies(t, b)[westRec.Name]; got.Origin != "west" {
		t.Fatalf("west's policy after east's calls: %+v", got)
	}
	if got := listedPolicies(t, b)[policy.DefaultPolicyName]; got.ClusterOf() != "" {
		t.Fatalf("the default policy became a cluster's: %+v", got)
	}
}

func TestTheAdminCannotWriteAClusterPolicy(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	rec := clusterPolicy(t, "to-west", "east")
	if _, err := east.SetClusterPolicies(ctxT(t), &apiv1.SetClusterPoliciesRequest{Policies: []*apiv1.Policy{rec}}); err != nil {
		t.Fatal(err)
	}

	// An admin apply with the origin label would pass for a cluster's policy.
	_, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: []*apiv1.Policy{clusterPolicy(t, "other", "east")}})
	wantCode(t, err, codes.InvalidArgument, "marks a policy applied in a cluster")

	// An admin apply of a mesh policy under the cluster policy's name would take it over.
	var p policy.ClusterConnectionPolicy
	if err := json.Unmarshal(rec.Json, &p); err != nil {
		t.Fatal(err)
	}
	delete(p.Metadata.Labels, policy.LabelOrigin)
	delete(p.Metadata.Labels, policy.LabelCluster)
	p.Origin = ""
	_, err = b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: []*apiv1.Policy{policyRecord(t, p)}})
	wantCode(t, err, codes.AlreadyExists, `was applied in cluster "east"`)
	if got := listedPolicies(t, b)[rec.Name]; got.Origin != "east" {
		t.Fatalf("after the refused applies: %+v", got)
	}
}
