package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// TestAnUpdateTooLargeToSendFailsAtOnce: an Update whose transaction is larger than the etcd
// client sends (2 MiB) fails at once, naming the size, and the writes behind it go through. It
// was retried as if etcd were busy (ResourceExhausted) until its context ended, holding every
// other write of the replica behind it: one agent's SetExports of 500 exports of 128 endpoints
// (each with its VIP) stalled the broker's writes for the call's deadline.
func TestAnUpdateTooLargeToSendFailsAtOnce(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	s := openEtcd(t, cluster.Client(t), "/toolarge/", store.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.Update(ctx, func(tx store.Tx) error {
		for i := range 500 {
			e := &apiv1.ServiceExport{Cluster: "east", Node: "gw1", Namespace: "shop", Name: fmt.Sprint("s", i)}
			for j := range 128 {
				e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.1.%d.%d", j>>8, j&0xff), Ready: true})
			}
			if err := tx.PutServiceExport(e); err != nil {
				return err
			}
			if err := tx.PutServiceVIP(&apiv1.ServiceVIP{Namespace: "shop", Name: fmt.Sprint("s", i), Vips: []string{"241.0.0.1"}}); err != nil {
				return err
			}
		}
		return nil
	})
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "larger than max") || took > 5*time.Second {
		t.Fatalf("a transaction over the client's limit: err %v after %v; want it refused at once, naming the size", err, took)
	}
	c, err := s.Update(ctx, func(tx store.Tx) error { return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1}) })
	if err != nil || c.Revision != 1 {
		t.Fatalf("the next write: revision %d, %v; want revision 1 (nothing of the refused one stored)", c.Revision, err)
	}
}
