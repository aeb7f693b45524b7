package broker

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
)

// churnEndpoints is the number of endpoints of each export the churn test writes: the size of one
// SetExports at the documented limits (admission.MaxExportsPerNode exports of this many endpoints
// is admission.MaxExportEndpointsPerSet).
const churnEndpoints = 128

// bulkExports is admission.MaxExportsPerNode exports of churnEndpoints ready endpoints each, all
// inside podCIDR 10.1.0.0/16 (the first cluster of a svcMesh).
func bulkExports() []*apiv1.ServiceExport {
	out := make([]*apiv1.ServiceExport, admission.MaxExportsPerNode)
	for i := range out {
		e := &apiv1.ServiceExport{Namespace: "churn", Name: fmt.Sprintf("svc-%03d", i),
			Ports: []*apiv1.ServicePort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
		for j := range churnEndpoints {
			n := i*churnEndpoints + j
			e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.1.%d.%d", n>>8, n&0xff), Ready: true})
		}
		out[i] = e
	}
	return out
}

// heapInuse is the heap in use after a forced collection, in bytes.
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestExportChurnKeepsTheHeapFlat churns one agent's exports at the documented limits (every
// export written, then every export withdrawn) while another cluster watches its imports: the
// state ends the same each round, so the broker's heap must too. A history kept by count of
// commits, not by size, held every round's exports (hundreds of MB after a few rounds, beyond a
// 512Mi container).
func TestExportChurnKeepsTheHeapFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 8 x 65,536 endpoints")
	}
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	// An importer that keeps up, as every other agent of the mesh does.
	w := m.watch("west", wantImports(0))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := w.Recv(); err != nil {
				return
			}
		}
	}()
	const rounds = 8
	heap := make([]uint64, rounds)
	for r := range rounds {
		resp := m.set("east", bulkExports()...)
		if len(resp.Exports) != admission.MaxExportsPerNode {
			t.Fatalf("round %d: %d exports stored, want %d", r+1, len(resp.Exports), admission.MaxExportsPerNode)
		}
		if resp := m.set("east"); len(resp.Exports) != 0 {
			t.Fatalf("round %d: %d exports left after withdrawing them all", r+1, len(resp.Exports))
		}
		heap[r] = heapInuse()
		t.Logf("round %d: heap in use after GC %.1f MB", r+1, float64(heap[r])/1e6)
	}
	if p := os.Getenv("CHURN_HEAP_PROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	// Rounds 4-8 may exceed round 2 by what the bounded histories hold at most, not by a round's
	// worth of exports per round.
	const slack = 64 << 20
	for r := 3; r < rounds; r++ {
		if heap[r] > heap[1]+slack {
			t.Errorf("round %d: heap in use %.1f MB, round 2 %.1f MB: grew by more than %d MB", r+1,
				float64(heap[r])/1e6, float64(heap[1])/1e6, slack>>20)
		}
	}
}
