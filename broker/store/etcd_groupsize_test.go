package store

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/btree"
)

// The sizes groupTxn keeps as Updates are added and dropped are exactly those of the transaction
// built from its union (conditions and ops): random groups of reads, lists and writes, with
// keys read again, written again, deleted, and events trimmed in runs.
func TestGroupTxnSizesAreTheTransactions(t *testing.T) {
	s := &Etcd{prefix: "/cm/store/"}
	st := &etcdState{tree: btree.NewG[etcdItem](8, itemLess), rev: 100}
	buckets := [][]byte{bucketClusters, bucketEndpoints, bucketNodeCerts, bucketMeshClaims, bucketMeta}
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() string {
		b := buckets[rng.IntN(len(buckets))]
		if rng.IntN(4) == 0 {
			return s.key(bucketMeta, keyRevision)
		}
		// Few keys per bucket in some groups, many in others: both sides of maxPointCompares.
		return s.key(b, []byte(fmt.Sprintf("k%d", rng.IntN(4+rng.IntN(40)))))
	}
	event := func() string { return s.key(bucketEvents, u64Key(uint64(rng.IntN(30)))) }
	for round := range 500 {
		g := newGroupTxn(s, st)
		bumps := false
		for range 1 + rng.IntN(40) {
			o := &etcdTxnKV{s: s, base: st, tree: st.tree, reads: map[string]int64{}, scans: map[string]string{}, writes: map[string]*[]byte{}}
			for range rng.IntN(1 + rng.IntN(20)) {
				o.reads[key()] = int64(rng.IntN(50))
			}
			if rng.IntN(8) == 0 {
				b := buckets[rng.IntN(len(buckets))]
				start := s.prefix + string(b) + "/"
				o.scans[start] = start[:len(start)-1] + "0"
			}
			for range rng.IntN(5) {
				k := key()
				if rng.IntN(3) == 0 {
					k = event()
				}
				if rng.IntN(3) == 0 {
					o.writes[k] = nil
				} else {
					v := make([]byte, rng.IntN(100))
					o.writes[k] = &v
				}
			}
			g.add(o)
			if rng.IntN(4) == 0 {
				g.drop()
			} else if rng.IntN(3) == 0 {
				bumps = true
			}
			cmps, failure := g.all.conditions(bumps)
			ops := g.all.ops()
			bytes := 0
			for k, v := range g.all.writes {
				bytes += len(k)
				if v != nil {
					bytes += len(*v)
				}
			}
			want := groupSize{cmps: len(cmps), failure: len(failure), ops: len(ops), bytes: bytes}
			if got := g.size(bumps); got != want {
				t.Fatalf("round %d: counted %+v, the transaction is %+v", round, got, want)
			}
		}
	}
}
