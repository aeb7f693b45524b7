package store_test

import (
	"context"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// FuzzPutMeshAddressClaim: a claim's key is the text of its address, and uniqueness of mesh
// addresses rests on one key per address. Whatever text a claim carries, the store keeps it only
// when it is an address in its canonical form without a zone (then reads it back unchanged under that key), and
// refuses anything else with an error, never a panic.
func FuzzPutMeshAddressClaim(f *testing.F) {
	for _, s := range []string{"242.0.0.1", "", "242.0.0.01", "2001:DB8::1", "2001:db8::1", "::ffff:1.2.3.4", "fe80::1%eth0", "242.0.0.1/32", " 242.0.0.1"} {
		f.Add(s)
	}
	s := store.NewMemory(store.Options{})
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, addr string) {
		c := &apiv1.MeshAddressClaim{Address: addr, Cluster: "east", ClusterUid: "u1", Node: "gw1"}
		_, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutMeshAddressClaim(c) })
		a, perr := netip.ParseAddr(addr)
		canonical := perr == nil && a.Zone() == "" && a.String() == addr
		if canonical != (err == nil) {
			t.Fatalf("claim of %q: err %v; canonical address: %v", addr, err, canonical)
		}
		if err != nil {
			return
		}
		_ = s.View(context.Background(), func(tx store.ReadTx) error {
			got, err := tx.MeshAddressClaim(addr)
			if err != nil || !proto.Equal(got, c) {
				t.Fatalf("claim of %q read back as %v, %v", addr, got, err)
			}
			return nil
		})
		if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteMeshAddressClaim(addr) }); err != nil {
			t.Fatal(err)
		}
	})
}
