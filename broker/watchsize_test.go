package broker

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
)

// bigPolicy is a valid policy of about 60 KiB of JSON (just under the 64 KiB bound): a cluster
// selector of 14 expressions of 64 values of 63 characters.
func bigPolicy(t *testing.T, name string, variant int) *apiv1.Policy {
	t.Helper()
	var exprs []string
	for e := range 14 {
		var vals []string
		for v := range 64 {
			vals = append(vals, fmt.Sprintf("v%02d%02d%04d", e, v, variant)+strings.Repeat("x", 53))
		}
		exprs = append(exprs, fmt.Sprintf("{key: k%d, operator: NotIn, values: [%s]}", e, strings.Join(vals, ",")))
	}
	p := policiesFromYAML(t, fmt.Sprintf("kind: ClusterConnectionPolicy\nmetadata: {name: %s}\nspec: {clusterSelector: {matchExpressions: [%s]}}\n", name, strings.Join(exprs, ",")))[0]
	if n := len(p.Json); n < 55<<10 || n > 64<<10 {
		t.Fatalf("test policy is %d bytes", n)
	}
	return p
}

// drain reads a watch until it reaches revision until, and returns the policies it holds then
// (starting from have) and the largest message it got.
func drain(t *testing.T, w apiv1.Agent_WatchClient, until uint64, have map[string]bool) (map[string]bool, int) {
	t.Helper()
	largest := 0
	for {
		m := recv(t, w)
		largest = max(largest, proto.Size(m))
		if m.Snapshot {
			have = map[string]bool{}
		}
		for _, ev := range m.Events {
			if ev.Kind != "policy" {
				continue
			}
			if ev.Type == apiv1.Event_DELETE {
				delete(have, ev.Key)
			} else {
				have[ev.Key] = true
			}
		}
		if m.Revision >= until {
			return have, largest
		}
	}
}

// Large policies once froze every agent's watch, even after they were deleted, and
// an agent resuming from an older revision got the same oversized replay forever. Here a real
// gRPC client with the default limits (4 MiB per message) watches 80 policies of 60 KiB (4.8 MiB)
// arrive, as a live watcher, from a snapshot and from a replay, and then leave again.
func TestAWatchNeverSendsAMessageTheAgentCannotReceive(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ec := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	live, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first := recv(t, live)
	start := first.Revision

	var names []string
	for round := range 4 {
		var ps []*apiv1.Policy
		for i := range 20 {
			name := fmt.Sprintf("big-%02d", round*20+i)
			names = append(names, name)
			ps = append(ps, bigPolicy(t, name, round*20+i))
		}
		if _, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: ps}); err != nil {
			t.Fatalf("apply round %d: %v", round, err)
		}
	}
	end := b.list().Revision
	want := len(names) + 1 // and the default policy

	got, largest := drain(t, live, end, map[string]bool{"default": true})
	if len(got) != want {
		t.Fatalf("the live watcher holds %d policies, want %d", len(got), want)
	}
	t.Logf("live watcher: largest message %d bytes", largest)

	snap, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, largest = drain(t, snap, end, nil); len(got) != want {
		t.Fatalf("a new watcher's snapshot holds %d policies, want %d", len(got), want)
	}
	t.Logf("snapshot: largest message %d bytes", largest)

	replay, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{SinceRevision: start})
	if err != nil {
		t.Fatal(err)
	}
	if got, largest = drain(t, replay, end, map[string]bool{"default": true}); len(got) != want {
		t.Fatalf("a watcher resuming from %d holds %d policies, want %d", start, len(got), want)
	}
	t.Logf("replay: largest message %d bytes", largest)

	// Deleting them all at once is one commit of 80 DELETEs: without their old values.
	if _, err := b.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{Names: names}); err != nil {
		t.Fatal(err)
	}
	if got, largest = drain(t, live, b.list().Revision, got); len(got) != 1 || largest > 64<<10 {
		t.Fatalf("after the delete the live watcher holds %d policies (largest message %d bytes), want the default only in small messages", len(got), largest)
	}
}

func TestSplitBatchKeepsPartsUnderTheBudgetAndResumable(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ev := func(rev uint64, typ apiv1.Event_Type, size int) *apiv1.Event {
		return &apiv1.Event{Type: typ, Kind: "policy", Key: fmt.Sprint("p", rev), Revision: rev,
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: &apiv1.Policy{Name: fmt.Sprint("p", rev), Json: []byte(strings.Repeat("x", size))}}}}
	}
	ca := &apiv1.CABundle{Pem: []byte("pem")}
	tests := []struct {
		name     string
		resp     *apiv1.WatchResponse
		parts    int
		revs     []uint64
		tailLast bool
	}{
		{"a small batch is one message", &apiv1.WatchResponse{Events: []*apiv1.Event{ev(5, apiv1.Event_UPSERT, 100)}, Revision: 5, Ca: ca}, 1, []uint64{5}, true},
		{"deltas are split at the budget, each part at its last event's revision",
			&apiv1.WatchResponse{Events: []*apiv1.Event{ev(5, 0, 600), ev(6, 0, 600), ev(7, 0, 600)}, Revision: 7, Ca: ca}, 3, []uint64{5, 6, 7}, true},
		{"a snapshot's parts before the last are at revision 0",
			&apiv1.WatchResponse{Snapshot: true, Events: []*apiv1.Event{ev(9, 0, 600), ev(9, 0, 600), ev(9, 0, 600)}, Revision: 9}, 3, []uint64{0, 0, 9}, false},
		{"a DELETE loses its large old value and fits",
			&apiv1.WatchResponse{Events: []*apiv1.Event{ev(5, apiv1.Event_DELETE, 5000), ev(6, apiv1.Event_DELETE, 5000)}, Revision: 6}, 1, []uint64{6}, false},
		{"an event larger than any agent takes is left out",
			&apiv1.WatchResponse{Events: []*apiv1.Event{ev(5, 0, 5<<20), ev(6, 0, 10)}, Revision: 6}, 1, []uint64{6}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parts := splitBatch(tt.resp, 1000, log)
			if len(parts) != tt.parts {
				t.Fatalf("%d parts, want %d", len(parts), tt.parts)
			}
			for i, p := range parts {
				last := i == len(parts)-1
				if p.Revision != tt.revs[i] || p.More == last || p.Snapshot != (tt.resp.Snapshot && i == 0) {
					t.Errorf("part %d: revision %d more %v snapshot %v; want revision %d more %v", i, p.Revision, p.More, p.Snapshot, tt.revs[i], !last)
				}
				if len(p.Events) > 0 && proto.Size(p) > 1000+200 && len(p.Events) > 1 {
					t.Errorf("part %d is %d bytes", i, proto.Size(p))
				}
				if tt.resp.Snapshot && !last {
					for _, e := range p.Events {
						if e.Revision != 0 {
							t.Errorf("part %d of a snapshot has an event at revision %d", i, e.Revision)
						}
					}
				}
				for _, e := range p.Events {
					if e.Type == apiv1.Event_DELETE && e.Resource != nil {
						t.Errorf("a DELETE kept its old value of %d bytes", proto.Size(e.Resource))
					}
				}
			}
			if tt.tailLast && parts[len(parts)-1].Ca == nil {
				t.Error("the CA bundle is not on the last part")
			}
		})
	}
}

// A snapshot goes compressed to an agent that accepts zstd, and what it holds once expanded is
// what an agent that does not accept it gets, in a quarter of the bytes at most.
func TestASnapshotGoesCompressedToAnAgentThatAcceptsZstd(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ec := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	var ps []*apiv1.Policy
	for i := range 12 {
		ps = append(ps, bigPolicy(t, fmt.Sprintf("big-%02d", i), i))
	}
	if _, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: ps}); err != nil {
		t.Fatal(err)
	}
	end := b.list().Revision
	// snapshot reads a watch's snapshot: its policies, and its bytes on the wire and expanded.
	snapshot := func(req *apiv1.WatchRequest) (policies []string, wire, expanded, encoded int) {
		w, err := ec.Watch(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		for {
			m := recv(t, w)
			wire += proto.Size(m)
			if len(m.Encoded) > 0 {
				encoded++
			}
			if err := watchzstd.Expand(m); err != nil {
				t.Fatal(err)
			}
			expanded += proto.Size(m)
			for _, ev := range m.Events {
				if ev.Kind == "policy" {
					policies = append(policies, ev.Key+":"+string(ev.GetResource().GetPolicy().GetJson()))
				}
			}
			if !m.More && m.Revision >= end {
				slices.Sort(policies)
				return policies, wire, expanded, encoded
			}
		}
	}
	plain, plainWire, _, plainEncoded := snapshot(&apiv1.WatchRequest{})
	got, wire, expanded, encoded := snapshot(&apiv1.WatchRequest{AcceptEncodings: []string{"br", watchzstd.Name}})
	if plainEncoded != 0 || encoded == 0 {
		t.Fatalf("compressed messages: %d to the agent that does not accept zstd, %d to the one that does", plainEncoded, encoded)
	}
	if !slices.Equal(got, plain) || len(got) != 13 {
		t.Fatalf("expanded, the snapshot holds %d policies, not the %d of the uncompressed one", len(got), len(plain))
	}
	if wire*4 > plainWire {
		t.Fatalf("the compressed snapshot is %d bytes (%d expanded), the uncompressed %d: want at most a quarter", wire, expanded, plainWire)
	}
	t.Logf("snapshot of 13 policies: %d bytes, %d compressed", plainWire, wire)

	// A watch that lists too many encodings is refused, naming the field.
	w, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{AcceptEncodings: slices.Repeat([]string{"zstd"}, 9)})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "accept_encodings") {
		t.Fatalf("a watch with 9 encodings: %v, want InvalidArgument naming accept_encodings", err)
	}
}
