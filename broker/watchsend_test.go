package broker

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// splitBatch sizes each event once and adds up the sizes: the parts must still hold every event
// once and in order, every part of more than one event must fit the budget exactly as gRPC
// encodes it, and a batch that fits must go as one message. Random batches of events of random
// sizes (clusters with labels, whose maps are what makes sizing costly) against several
// budgets, the 31 KiB default among them.
func TestSplitBatchPartsFitTheBudgetExactly(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		budget := []int{500, 2000, 10000, DefaultWatchMessageBytes}[round%4]
		var evs []*apiv1.Event
		for i := range rng.IntN(300) {
			labels := map[string]string{}
			for j := range rng.IntN(20) {
				labels[fmt.Sprintf("k%d", j)] = strings.Repeat("v", rng.IntN(200))
			}
			c := &apiv1.Cluster{Name: fmt.Sprintf("c%d", i), Labels: labels}
			evs = append(evs, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "cluster", Key: c.Name,
				Revision: uint64(i + 1), Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}}})
		}
		resp := &apiv1.WatchResponse{Events: evs, Revision: uint64(len(evs))}
		parts := splitBatch(resp, budget, log)
		var got []string
		for i, p := range parts {
			if n := proto.Size(p); len(p.Events) > 1 && n > budget {
				t.Fatalf("round %d: part %d of %d events is %d bytes, budget %d", round, i, len(p.Events), n, budget)
			}
			for _, e := range p.Events {
				got = append(got, e.Key)
			}
		}
		var want []string
		for _, e := range evs {
			want = append(want, e.Key)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("round %d: parts hold %d events %v, want %d in order", round, len(got), got, len(want))
		}
		if whole := proto.Size(resp); whole+64 <= budget && len(parts) != 1 {
			t.Fatalf("round %d: a batch of %d bytes, under the budget %d, went in %d parts", round, whole, budget, len(parts))
		}
	}
}
