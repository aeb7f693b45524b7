package clusterpolicy

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

// policyClient is an AgentClient whose SetClusterPolicies records the request and answers err.
type policyClient struct {
	apiv1.AgentClient
	reqs []*apiv1.SetClusterPoliciesRequest
	err  error
}

func (c *policyClient) SetClusterPolicies(_ context.Context, req *apiv1.SetClusterPoliciesRequest, _ ...grpc.CallOption) (*apiv1.SetClusterPoliciesResponse, error) {
	c.reqs = append(c.reqs, req)
	if c.err != nil {
		return nil, c.err
	}
	return &apiv1.SetClusterPoliciesResponse{Revision: 7}, nil
}

func TestClusterPoliciesAreSentOnlyOnceReadAndRefusalsShowInStatus(t *testing.T) {
	a := NewSync(SyncDeps{Log: slog.New(slog.DiscardHandler), Cluster: "east"})
	c := &policyClient{}
	// Before the source's first set nothing goes out: an empty set would delete the cluster's
	// policies at the broker.
	if err := a.send(context.Background(), c); err != nil || len(c.reqs) != 0 {
		t.Fatalf("before the first set: %v, %d requests", err, len(c.reqs))
	}

	good := policy.ClusterConnectionPolicy{Kind: policy.Kind,
		Metadata: policy.ObjectMeta{Name: "to-west", Labels: map[string]string{policy.LabelOrigin: policy.OriginClusterLabel}},
		Spec:     policy.Spec{ClusterSelector: &policy.Selector{}, CableDriver: &policy.CableDriver{Name: "vxlan"}}}
	bad := good.DeepCopy()
	bad.Metadata.Name, bad.Metadata.Labels = "nolabel", nil
	a.set(Build("east", []Item{{Source: "/p/a.yaml", Policy: good}, {Source: "/p/b.yaml", Policy: bad}}))

	if err := a.send(context.Background(), c); err != nil || len(c.reqs) != 1 {
		t.Fatalf("send: %v, %d requests", err, len(c.reqs))
	}
	sent := c.reqs[0].Policies
	if len(sent) != 1 || sent[0].Name != policy.ClusterPolicyName("to-west", "east") {
		t.Fatalf("sent %v", sent)
	}
	var p policy.ClusterConnectionPolicy
	if err := json.Unmarshal(sent[0].Json, &p); err != nil || p.Origin != "east" || p.Metadata.Labels[policy.LabelCluster] != "east" {
		t.Fatalf("sent policy %+v (%v)", p, err)
	}
	probs := a.Problems()
	if len(probs) != 1 || !strings.Contains(probs[0].Message, "/p/b.yaml") || !strings.Contains(probs[0].Message, policy.MissingOriginLabelMessage) {
		t.Fatalf("problems %v", probs)
	}

	// A broker refusal is a status problem until a send succeeds.
	c.err = status.Error(codes.InvalidArgument, "metadata.name: nope")
	if err := a.send(context.Background(), c); err == nil {
		t.Fatal("a refused send returned no error")
	}
	if probs := a.Problems(); len(probs) != 2 || !strings.Contains(probs[1].Message, "not synced to the broker: metadata.name: nope") {
		t.Fatalf("problems after a refusal %v", probs)
	}
	c.err = nil
	if err := a.send(context.Background(), c); err != nil || len(a.Problems()) != 1 {
		t.Fatalf("after a successful send: %v, problems %v", err, a.Problems())
	}
}
