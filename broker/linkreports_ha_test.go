package broker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// TestLinkReportsReachEveryReplica: a report an agent sends to one replica is listed by the
// other (through etcd), under a lease so that it goes away on its own.
func TestLinkReportsReachEveryReplica(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	root := "/cablemesh-linkreports-test/"
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := startReplica(t, etcd, root, dirA)
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(dirA, SecretKeyFile), filepath.Join(dirB, SecretKeyFile))
	b, err := startReplica(t, etcd, root, dirB)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := a.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "alpha", PodCidrs: []string{"10.1.0.0/16"}})
	if err != nil {
		t.Fatal(err)
	}
	ag := mustJoin(t, a.addr, tok.Token, "alpha", "gw1")
	if _, err := a.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "beta", PodCidrs: []string{"10.2.0.0/16"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ag.client(t, a.addr).ReportLinks(ctxT(t), &apiv1.ReportLinksRequest{Full: true, AgentVersion: "v2",
		Links: []*apiv1.LinkReport{{RemoteCluster: "beta", State: "connected", Driver: "wireguard"}}})
	if err != nil || !resp.Accepted {
		t.Fatalf("report to replica A: %v %v", resp, err)
	}
	// A writes to etcd from a loop of its own: soon, not in the call.
	var list *apiv1.ListLinkReportsResponse
	if werr := waitUntil(10*time.Second, func() bool {
		list, err = b.admin.ListLinkReports(ctxT(t), &apiv1.ListLinkReportsRequest{})
		return err == nil && len(list.Nodes) > 0
	}); werr != nil {
		t.Fatalf("replica B never listed the report made to A: %v (last error %v)", werr, err)
	}
	if len(list.Nodes) != 1 || list.Nodes[0].Node != "gw1" || list.Nodes[0].AgentVersion != "v2" || len(list.Nodes[0].Links) != 1 {
		t.Fatalf("replica B lists %v, want alpha/gw1's report made to A", list.Nodes)
	}
	kv, err := etcd.Client(t).Get(context.Background(), root+"linkreports/alpha/gw1")
	if err != nil {
		t.Fatal(err)
	}
	if len(kv.Kvs) != 1 || kv.Kvs[0].Lease == 0 {
		t.Fatalf("etcd holds %v, want the report under a lease", kv.Kvs)
	}
	ttl, err := etcd.Client(t).TimeToLive(context.Background(), clientv3.LeaseID(kv.Kvs[0].Lease))
	if err != nil {
		t.Fatal(err)
	}
	if forget := a.srv.linkReports.forget.Seconds(); ttl.GrantedTTL < int64(forget) || ttl.GrantedTTL > int64(forget)+1 {
		t.Fatalf("lease of %ds, want the forget bound %.0fs", ttl.GrantedTTL, forget)
	}
}
