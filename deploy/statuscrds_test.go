package deploy

import (
	"testing"

	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cablemesh/cablemesh/agent/kubestatus"
	"github.com/cablemesh/cablemesh/policy"
)

// TestTheStatusWriterWritesOnlyWhatTheCRDsKeep: every field agent/kubestatus writes is in the
// CRD's schema, so the API server neither prunes it (the writer would then see a difference and
// write again every interval, for ever) nor refuses it.
func TestTheStatusWriterWritesOnlyWhatTheCRDsKeep(t *testing.T) {
	for _, tc := range []struct {
		file, kind string
		status     any
	}{
		{"cablemesh.io_clusterlinks.yaml", "ClusterLink", &kubestatus.LinkStatus{Connect: true, Policy: "p", Mode: "gateway", Driver: "wireguard",
			State: "connected", Alive: true, LatencyP50: "0.10ms", LatencyP95: "0.20ms", LatencyP99: "0.30ms", Services: 2, Gateway: "gw", Message: "m"}},
		{"cablemesh.io_clusterconnectionpolicies.yaml", "ClusterConnectionPolicy", &kubestatus.PolicyStatus{ObservedGeneration: 3, SyncedAs: "p-0123456789",
			PairsDecided: 1, PairsConnected: 1, ConflictsLost: 1,
			Decided:   []kubestatus.DecidedPair{{ClusterA: "a", ClusterB: "b", Connect: true, Driver: "vxlan"}},
			Conflicts: []policy.Conflict{{ClusterA: "a", ClusterB: "c", Winner: "w", Reason: "r"}}, Error: "e"}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			c := internalCRD(t, crd(t, tc.file))
			props := c.Spec.Validation.OpenAPIV3Schema
			s, err := structuralschema.NewStructural(props)
			if err != nil {
				t.Fatal(err)
			}
			status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tc.status)
			if err != nil {
				t.Fatal(err)
			}
			obj := map[string]any{"apiVersion": "cablemesh.io/v1alpha1", "kind": tc.kind, "metadata": map[string]any{"name": "x"}, "status": status}
			if tc.kind == "ClusterConnectionPolicy" {
				obj["spec"] = map[string]any{"clusterSelector": map[string]any{}}
			}
			if pruned := pruning.PruneWithOptions(obj, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}); len(pruned) > 0 {
				t.Errorf("the API server would prune %v", pruned)
			}
			sv, _, err := validation.NewSchemaValidator(props)
			if err != nil {
				t.Fatal(err)
			}
			if errs := validation.ValidateCustomResource(nil, obj, sv); len(errs) > 0 {
				t.Errorf("the API server would refuse the status: %v", errs.ToAggregate())
			}
		})
	}
}
