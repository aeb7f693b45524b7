package store_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cablemesh/cablemesh/broker/store"
)

// TestBoltOpensThePreviousVersionsStore opens a broker.db written by the broker of commit
// 98843a3 (the release tests/netns/upgrade_test.go upgrades from), from a two-cluster mesh on
// that version (clusters x and y on a vxlan policy, two exports each; compacted with
// bbolt.Compact to keep it small). The next version must read every record of it. A bbolt file
// is in the machine's byte order: this one is little-endian (amd64).
func TestBoltOpensThePreviousVersionsStore(t *testing.T) {
	data, err := os.ReadFile("testdata/v98843a3/broker.db")
	if err != nil {
		t.Fatal(err)
	}
	// OpenBolt writes (it creates the buckets a newer version adds): work on a copy.
	path := filepath.Join(t.TempDir(), "broker.db")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := store.OpenBolt(path, store.Options{})
	if err != nil {
		t.Fatalf("open the previous version's store: %v", err)
	}
	defer s.Close()
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		if rev := tx.Revision(); rev < 16 {
			t.Errorf("revision %d, want at least 16 (the agents' cached state is at 16)", rev)
		}
		clusters, err := tx.Clusters()
		if err != nil {
			return err
		}
		var names []string
		for _, c := range clusters {
			names = append(names, c.GetName())
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"x", "y"}) {
			t.Errorf("clusters %v, want [x y]", names)
		}
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		if len(eps) != 2 {
			t.Errorf("%d endpoints, want 2: %v", len(eps), eps)
		}
		pol, err := tx.Policy("upgrade-pvx")
		if err != nil {
			return err
		}
		if pol == nil {
			t.Error("policy upgrade-pvx missing")
		}
		exports, err := tx.ServiceExports()
		if err != nil {
			return err
		}
		if len(exports) != 4 {
			t.Errorf("%d service exports, want 4 (web and db of x and y)", len(exports))
		}
		vips, err := tx.ServiceVIPs()
		if err != nil {
			return err
		}
		if len(vips) != 4 {
			t.Errorf("%d service VIPs, want 4 (one per exported service): %v", len(vips), vips)
		}
		// A VIP must stay the service's across the upgrade (clients hold it).
		web, err := tx.ServiceVIP("shop", "web-x")
		if err != nil {
			return err
		}
		if !slices.Equal(web.GetVips(), []string{"241.0.0.4"}) {
			t.Errorf("shop/web-x VIPs %v, want [241.0.0.4]", web.GetVips())
		}
		certs, err := tx.NodeCertificates()
		if err != nil {
			return err
		}
		if len(certs) != 2 {
			t.Errorf("%d node certificates, want 2 (one per gateway)", len(certs))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read the previous version's store: %v", err)
	}
}
