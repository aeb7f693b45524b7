package broker

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// churnEndpoints is the number of endpoints of each export the churn test writes: the size of one
// SetExports at the documented limits (admission.MaxExportsPerNode exports of this many endpoints
// is admission.MaxExportEndpointsPerSet).
const churnEndpoints = 128

// bulkExports is admission.MaxExportsPerNode exports of churnEndpoints ready endpoints each, all
// inside podCIDR 10.1.0.0/16 (the first cluster of a svcMesh).
func bulkExports(n int) []*apiv1.ServiceExport {
	out := make([]*apiv1.ServiceExport, n)
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
// state ends the same each round, so the broker's heap must too. Histories kept by count (of
// commits, of import views), not by size, held every round's exports: the heap grew by about
// 25 MB a round here, and by hundreds of MB a round in a broker with real agents, past the
// 512Mi limit of the shipped Deployment.
func TestExportChurnKeepsTheHeapFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 8 x 65,536 endpoints")
	}
	// Rounds 4-8 may exceed round 2 by what the bounded histories hold at most (recent batches,
	// import views, the log: 4 + 4 + 16 MiB encoded, a few times that decoded, some of it held
	// by round 2 already), not by a round's worth of exports per round.
	churnKeepsTheHeapFlat(t, newSvcMesh(t, t.TempDir(), brokerOpts{exportQuota: churnQuota}, "east", "west"), admission.MaxExportsPerNode, 8, 2, 48<<20)
}

// TestExportChurnKeepsTheHeapFlatOnEtcd is the same churn with the state in etcd: the replica's
// mirror of etcd holds the event log, so the log is bounded in bytes as well as in events. 256
// exports a round (one SetExports of 500 did not commit on etcd within 20 s), so the histories
// fill later (by round 9 here); from then on the heap stays where it is.
func TestExportChurnKeepsTheHeapFlatOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 8 x 65,536 endpoints")
	}
	etcd := etcdtest.Start(t, 1)
	st, err := store.OpenEtcd(t.Context(), etcd.Client(t), "/cablemesh-churn/", store.Options{}, store.EtcdOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o := brokerOpts{exportQuota: churnQuota, wrapStore: func(mem store.Store) store.Store {
		mem.Close()
		return st
	}}
	churnKeepsTheHeapFlat(t, newSvcMesh(t, t.TempDir(), o, "east", "west"), 256, 16, 10, 16<<20)
}

// churnQuota lets one cluster export what one node may (MaxExportsPerNode x churnEndpoints):
// the churn measures the broker's memory, not the per-cluster quota that would refuse it first.
var churnQuota = admission.ExportQuota{Services: 1 << 20, Endpoints: 1 << 24, ServiceMapEntries: 1 << 24}

// churnKeepsTheHeapFlat churns n exports of churnEndpoints endpoints each, for rounds rounds,
// and fails when the heap in use after a round from round ref+2 on exceeds that of round ref by
// more than slack bytes.
func churnKeepsTheHeapFlat(t *testing.T, m *svcMesh, n, rounds, ref int, slack uint64) {
	// An importer that keeps up, as every other agent of the mesh does.
	w := m.watch("west", wantImports(0))
	go func() {
		for {
			if _, err := w.Recv(); err != nil {
				return
			}
		}
	}()
	heap := make([]uint64, rounds)
	for r := range rounds {
		start := time.Now()
		resp := m.set("east", bulkExports(n)...)
		if len(resp.Exports) != n {
			t.Fatalf("round %d: %d exports stored, want %d", r+1, len(resp.Exports), n)
		}
		t.Logf("round %d: exported in %v", r+1, time.Since(start))
		if resp := m.set("east"); len(resp.Exports) != 0 {
			t.Fatalf("round %d: %d exports left after withdrawing them all", r+1, len(resp.Exports))
		}
		heap[r] = heapInuse()
		t.Logf("round %d: heap in use after GC %.1f MB", r+1, float64(heap[r])/1e6)
	}
	if p := os.Getenv("CHURN_HEAP_PROFILE"); p != "" {
		writeHeapProfile(t, p)
	}
	for r := ref + 1; r < rounds; r++ {
		if heap[r] > heap[ref-1]+slack {
			t.Errorf("round %d: heap in use %.1f MB, round %d %.1f MB: grew by more than %d MiB", r+1,
				float64(heap[r])/1e6, ref, float64(heap[ref-1])/1e6, slack>>20)
		}
	}
}

func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatal(err)
	}
}
