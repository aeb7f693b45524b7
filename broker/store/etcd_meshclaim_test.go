package store_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// TestEtcdTwoReplicasNeverHoldOneMeshAddressClaim: nodes claim mesh addresses through two
// replicas at once as the broker allocates them: point reads of claims from the lowest address
// up, then a put of the first free one, in one Update that writes nothing else, so nothing but
// the claim keys read orders them (no revision is bumped). Every acknowledged claim is the node's
// own in the end, and no address went to two nodes.
func TestEtcdTwoReplicasNeverHoldOneMeshAddressClaim(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := newRoot(t)
	reps := []*store.Etcd{openEtcd(t, cluster.Client(t), root, store.Options{}), openEtcd(t, cluster.Client(t), root, store.Options{})}
	const nodes = 40
	var (
		mu   sync.Mutex
		got  = map[string]string{} // address → node, as acknowledged
		runs int
		wg   sync.WaitGroup
	)
	for i := range nodes {
		wg.Go(func() {
			node := fmt.Sprintf("gw%02d", i)
			var addr string
			_, err := reps[i%2].Update(context.Background(), func(tx store.Tx) error {
				mu.Lock()
				runs++
				mu.Unlock()
				for a := netip.MustParseAddr("242.0.0.1"); ; a = a.Next() {
					c, err := tx.MeshAddressClaim(a.String())
					if err != nil {
						return err
					}
					if c == nil {
						addr = a.String()
						return tx.PutMeshAddressClaim(&apiv1.MeshAddressClaim{Address: addr, Cluster: "east", ClusterUid: "u1", Node: node})
					}
				}
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("claim for %s: %v", node, err)
				return
			}
			if other, dup := got[addr]; dup {
				t.Errorf("%s acknowledged to %s and %s", addr, other, node)
			}
			got[addr] = node
		})
	}
	wg.Wait()
	if len(got) != nodes {
		t.Fatalf("%d distinct addresses acknowledged, want %d", len(got), nodes)
	}
	for _, r := range reps {
		err := r.View(context.Background(), func(tx store.ReadTx) error {
			all, err := tx.MeshAddressClaims()
			if err != nil {
				return err
			}
			if len(all) != nodes {
				return fmt.Errorf("%d claims stored, want %d", len(all), nodes)
			}
			for _, c := range all {
				if got[c.Address] != c.Node {
					return fmt.Errorf("%s is stored as %s's, acknowledged to %q", c.Address, c.Node, got[c.Address])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d claims through two replicas in %d runs of the update functions", nodes, runs)
}
