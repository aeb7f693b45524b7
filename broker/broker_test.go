package broker

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

func TestFirstStartWritesAnAdminConfigThatWorks(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, brokerOpts{durable: true})
	path := filepath.Join(dir, AdminConfigFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("admin.yaml mode %v, want 0600", st.Mode().Perm())
	}
	cfg, err := adminconfig.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker != b.addr {
		t.Fatalf("admin.yaml broker %q, want the listen address %q", cfg.Broker, b.addr)
	}
	for _, f := range []string{pki.CAKeyFile, pki.TokenKeyFile, pki.AdminKeyFile, pki.ServerKeyFile, StoreFile, MeshSecretFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", f, err, st.Mode().Perm())
		}
	}
	if got := b.list(); len(got.Clusters) != 0 {
		t.Fatalf("fresh broker lists %d clusters", len(got.Clusters))
	}
}

func TestAnUnspecifiedListenAddressBecomesLoopbackInAdminConfig(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(t.Context(), Config{DataDir: dir, Listen: "0.0.0.0:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.writeAdminConfig(fakeAddr("0.0.0.0:7443")); err != nil {
		t.Fatal(err)
	}
	cfg, err := adminconfig.Load(srv.AdminConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker != "127.0.0.1:7443" {
		t.Fatalf("broker %q, want 127.0.0.1:7443", cfg.Broker)
	}
}

type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }

func TestRestartLosesNothing(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	b := startBroker(t, dir, brokerOpts{clock: clk, durable: true})
	for i, name := range []string{"east", "west", "north"} {
		b.token(name, fmt.Sprintf("10.%d.0.0/16", i+1))
	}
	if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "west"}); err != nil {
		t.Fatal(err)
	}
	a := mustJoin(t, b.addr, b.token("east"), "east", "gw1")
	if _, err := a.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 5}); err != nil {
		t.Fatal(err)
	}
	before := b.list()
	caBefore, _ := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	adminBefore, _ := os.ReadFile(filepath.Join(dir, AdminConfigFile))
	addr := b.addr
	b.stop()

	// The broker was down for longer than the lease: a restart must not reap the endpoint at once.
	clk.Advance(time.Minute)
	b2 := startBroker(t, dir, brokerOpts{addr: addr, clock: clk, durable: true})
	caAfter, _ := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	adminAfter, _ := os.ReadFile(filepath.Join(dir, AdminConfigFile))
	if !sameBytes(caBefore, caAfter) || !sameBytes(adminBefore, adminAfter) {
		t.Fatal("restart changed the CA or admin.yaml")
	}
	after := b2.list()
	if len(after.Clusters) != 2 || after.Revision != before.Revision {
		t.Fatalf("after restart: %d clusters at revision %d; before: %d at %d", len(after.Clusters), after.Revision, len(before.Clusters), before.Revision)
	}
	for i := range before.Clusters {
		if !proto.Equal(before.Clusters[i], after.Clusters[i]) {
			t.Fatalf("cluster changed across restart:\n%v\n%v", before.Clusters[i], after.Clusters[i])
		}
	}
	ids := map[string]uint32{}
	for _, c := range after.Clusters {
		ids[c.Name] = c.Id
	}
	if ids["east"] != 1 || ids["north"] != 3 {
		t.Fatalf("IDs after restart %v, want east=1 north=3", ids)
	}
	if len(after.Endpoints) != 1 || !after.Endpoints[0].LeaseExpires.AsTime().After(clk.Now()) {
		t.Fatalf("endpoint after restart %v: want it kept with a lease extended past now %v", after.Endpoints, clk.Now())
	}
	b2.reap()
	if got := b2.list(); len(got.Endpoints) != 1 {
		t.Fatal("the reaper withdrew an endpoint whose lease the restart extended")
	}
	// The lowest free ID (west's 2) goes to the next new cluster; the old agent cert still works.
	resp, err := b2.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "south", PodCidrs: []string{"10.9.0.0/16"}})
	if err != nil || resp.Cluster.Id != 2 {
		t.Fatalf("new cluster after restart: %v, %v; want ID 2", resp, err)
	}
	if _, err := a.client(t, b2.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"}); err != nil {
		t.Fatalf("agent certificate from before the restart: %v", err)
	}
}

func TestTheTwoHundredFiftySixthClusterIsRefused(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	for i := 1; i <= 255; i++ {
		resp, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: fmt.Sprintf("c%d", i), PodCidrs: []string{fmt.Sprintf("10.%d.0.0/16", i)}})
		if err != nil || resp.Cluster.Id != uint32(i) {
			t.Fatalf("cluster %d: %v, %v", i, resp.GetCluster(), err)
		}
	}
	before := b.list().Revision
	_, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "c256", PodCidrs: []string{"11.0.0.0/16"}})
	wantCode(t, err, codes.ResourceExhausted, "mesh is full: ", `"c256"`)
	if got := b.list(); len(got.Clusters) != 255 || got.Revision != before {
		t.Fatalf("refusal changed the store: %d clusters, revision %d (was %d)", len(got.Clusters), got.Revision, before)
	}
	// A token for an existing cluster is still issued when the mesh is full.
	b.token("c7")
}

func TestClusterCreationRules(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	if _, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, Labels: map[string]string{"env": "prod"}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		req      *apiv1.CreateJoinTokenRequest
		code     codes.Code
		fragment []string
	}{
		{"the same name with other pod CIDRs is refused as a duplicate",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.2.0.0/16"}},
			codes.AlreadyExists, []string{`cluster "east" already exists with pod CIDRs [10.1.0.0/16]`, "10.2.0.0/16"}},
		{"the same name with other service CIDRs is refused",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", ServiceCidrs: []string{"10.97.0.0/16"}},
			codes.AlreadyExists, []string{"service CIDRs [10.96.0.0/16]"}},
		{"the same name with another label value is refused",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", Labels: map[string]string{"env": "dev"}},
			codes.AlreadyExists, []string{`label "env" is "prod", not "dev"`}},
		{"an overlapping pod CIDR is refused naming both clusters and CIDRs",
			&apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.1.128.0/17"}},
			codes.FailedPrecondition, []string{`pod CIDR 10.1.128.0/17 of cluster "west" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`}},
		{"an overlapping service CIDR is refused",
			&apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/12"}},
			codes.FailedPrecondition, []string{"service CIDR 10.96.0.0/12", "service CIDR 10.96.0.0/16"}},
		{"a new cluster needs pod CIDRs",
			&apiv1.CreateJoinTokenRequest{Cluster: "west"},
			codes.InvalidArgument, []string{"pod CIDRs are required"}},
		{"a bad name is refused naming it",
			&apiv1.CreateJoinTokenRequest{Cluster: "West_1", PodCidrs: []string{"10.2.0.0/16"}},
			codes.InvalidArgument, []string{`cluster name "West_1"`}},
		{"a bad CIDR is refused naming it",
			&apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.1/16"}},
			codes.InvalidArgument, []string{`pod CIDR "10.2.0.1/16" has host bits set`}},
		{"a bad label is refused naming it",
			&apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.0/16"}, Labels: map[string]string{"env": "a b"}},
			codes.InvalidArgument, []string{`label "env": value "a b"`}},
		{"a negative validity is refused",
			&apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.0/16"}, ValidForSeconds: -1},
			codes.InvalidArgument, []string{"valid_for_seconds -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := b.list()
			_, err := b.admin.CreateJoinToken(ctxT(t), tt.req)
			wantCode(t, err, tt.code, tt.fragment...)
			after := b.list()
			if after.Revision != before.Revision || len(after.Clusters) != len(before.Clusters) {
				t.Fatalf("a refused request changed the store: revision %d -> %d", before.Revision, after.Revision)
			}
		})
	}
	// Another node's token for the same cluster, with the same or no CIDRs, is fine and reuses it.
	for _, req := range []*apiv1.CreateJoinTokenRequest{
		{Cluster: "east"},
		{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, Labels: map[string]string{"env": "prod"}},
	} {
		resp, err := b.admin.CreateJoinToken(ctxT(t), req)
		if err != nil || resp.Cluster.Id != 1 {
			t.Fatalf("second token for east (%v): %v, %v", req, resp.GetCluster(), err)
		}
	}
}

func TestJoinTokens(t *testing.T) {
	clk := newClock()
	b := startBroker(t, t.TempDir(), brokerOpts{clock: clk})
	good := b.token("east", "10.1.0.0/16")
	b.token("west", "10.2.0.0/16")
	short, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", ValidForSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	claims, _ := jointoken.Decode(good)
	otherKey := make([]byte, 32)
	rand.Read(otherKey)
	forged, err := jointoken.Sign(claims, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(good, good[5:12], "AAAAAAA", 1)

	a := mustJoin(t, b.addr, good, "east", "gw1")
	if !strings.Contains(string(a.cert), "BEGIN CERTIFICATE") || !sameBytes(a.ca, b.srv.pki.CAPEM) {
		t.Fatal("join response lacks the certificate or the CA")
	}
	// A token is one-time by default: a second node is refused, and says why.
	_, err = join(t, b.addr, good, "east", "gw2")
	wantCode(t, err, codes.Unauthenticated, "join token already used", `node "gw1"`)

	clk.Advance(2 * time.Minute) // the short token has expired; the 24h one has not
	tests := []struct {
		name      string
		token     string
		cluster   string
		code      codes.Code
		fragments []string
	}{
		{"an expired token is refused", short.Token, "east", codes.Unauthenticated, []string{"join token has expired", `cluster "east"`}},
		{"a forged token is refused", forged, "east", codes.Unauthenticated, []string{"signature is invalid"}},
		{"a tampered token is refused", tampered, "east", codes.InvalidArgument, []string{"malformed join token"}},
		{"garbage is refused", "hello", "east", codes.InvalidArgument, []string{"malformed join token"}},
		{"a token for another cluster is refused", good, "west", codes.PermissionDenied, []string{`join token is for cluster "east", not "west"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := join(t, b.addr, tt.token, tt.cluster, "gw9")
			wantCode(t, err, tt.code, tt.fragments...)
		})
	}
	t.Run("a token of a removed cluster is refused", func(t *testing.T) {
		if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "east"}); err != nil {
			t.Fatal(err)
		}
		_, err := join(t, b.addr, good, "east", "gw3")
		wantCode(t, err, codes.Unauthenticated, "was removed")
		b.token("east", "10.1.0.0/16") // recreated: a new UID, and the old token still fails
		_, err = join(t, b.addr, good, "east", "gw3")
		wantCode(t, err, codes.Unauthenticated, "was removed")
	})
}

func TestAuthorization(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	mustJoin(t, b.addr, b.token("west", "10.2.0.0/16"), "west", "gw1")
	ec := east.client(t, b.addr)

	t.Run("an agent may not write another cluster's endpoint", func(t *testing.T) {
		_, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("west", "gw1", "192.0.2.2")})
		wantCode(t, err, codes.PermissionDenied, "agent east/gw1", "west/gw1")
	})
	t.Run("an agent may not write another node's endpoint of its own cluster", func(t *testing.T) {
		_, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw2", "192.0.2.2")})
		wantCode(t, err, codes.PermissionDenied, "east/gw2")
		_, err = ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw2"})
		wantCode(t, err, codes.PermissionDenied, "east/gw2")
	})
	t.Run("an agent certificate may not call Admin", func(t *testing.T) {
		_, err := apiv1.NewAdminClient(east.dial(t, b.addr)).ListClusters(ctxT(t), &apiv1.ListClustersRequest{})
		wantCode(t, err, codes.PermissionDenied, "needs the admin certificate", "agent east/gw1")
		_, err = apiv1.NewAdminClient(east.dial(t, b.addr)).RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "west"})
		wantCode(t, err, codes.PermissionDenied)
	})
	t.Run("the admin certificate may not call agent RPCs", func(t *testing.T) {
		_, err := apiv1.NewAgentClient(dialAdmin(t, b.dir, b.addr)).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"})
		wantCode(t, err, codes.PermissionDenied, "admin certificate may not call it")
	})
	t.Run("no client certificate gets only Join", func(t *testing.T) {
		_, err := join(t, b.addr, "x", "east", "gw1")
		wantCode(t, err, codes.InvalidArgument) // reached Join itself
		conn := noCertConn(t, b.addr, east.ca)
		_, err = apiv1.NewAdminClient(conn).ListClusters(ctxT(t), &apiv1.ListClustersRequest{})
		wantCode(t, err, codes.Unauthenticated, "none was presented")
		_, err = apiv1.NewAgentClient(conn).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
		wantCode(t, err, codes.Unauthenticated, "none was presented")
	})
	t.Run("a removed cluster's certificate is refused, also after the name is reused", func(t *testing.T) {
		if _, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "east"}); err != nil {
			t.Fatal(err)
		}
		if got := b.list(); len(got.Endpoints) != 0 {
			t.Fatalf("removing east left endpoints %v", got.Endpoints)
		}
		_, err := ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"})
		wantCode(t, err, codes.Unauthenticated, `cluster "east"`, "was removed")
		b.token("east", "10.1.0.0/16")
		_, err = ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")})
		wantCode(t, err, codes.Unauthenticated, "was removed")
		_, err = ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"})
		wantCode(t, err, codes.Unauthenticated, "was removed")
		w, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		wantCode(t, err, codes.Unauthenticated, "was removed")
	})
}

func TestEndpointValidation(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	resp, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}})
	if err != nil {
		t.Fatal(err)
	}
	ec := mustJoin(t, b.addr, resp.Token, "east", "gw1").client(t, b.addr)
	mod := func(f func(e *apiv1.Endpoint)) *apiv1.Endpoint {
		e := endpoint("east", "gw1", "192.0.2.1", "10.1.0.0/16", "10.96.0.0/16")
		f(e)
		return e
	}
	tests := []struct {
		name     string
		e        *apiv1.Endpoint
		lease    int64
		fragment string
	}{
		{"a missing private IP", mod(func(e *apiv1.Endpoint) { e.PrivateIp = "" }), 0, "private_ip is empty"},
		{"a bad private IP", mod(func(e *apiv1.Endpoint) { e.PrivateIp = "10.0.0.300" }), 0, `private_ip "10.0.0.300"`},
		{"a bad public IP", mod(func(e *apiv1.Endpoint) { e.PublicIp = "x" }), 0, `public_ip "x"`},
		{"port zero", mod(func(e *apiv1.Endpoint) { e.CablePorts["wireguard"] = 0 }), 0, `cable_ports["wireguard"] = 0`},
		{"a port above 65535", mod(func(e *apiv1.Endpoint) { e.CablePorts["wireguard"] = 70000 }), 0, "70000"},
		{"a bad WireGuard key", mod(func(e *apiv1.Endpoint) { e.SetAttributes("wireguard", map[string]string{"publicKey": "abc"}) }), 0, `wireguard publicKey "abc"`},
		{"a subnet outside the cluster's CIDRs", mod(func(e *apiv1.Endpoint) { e.Subnets = []string{"10.2.0.0/24"} }), 0, "subnet 10.2.0.0/24 is not inside"},
		{"a malformed subnet", mod(func(e *apiv1.Endpoint) { e.Subnets = []string{"10.1.0.1/16"} }), 0, "host bits"},
		{"a negative lease", mod(func(e *apiv1.Endpoint) {}), -5, "lease_seconds -5"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: tt.e, LeaseSeconds: tt.lease})
			wantCode(t, err, codes.InvalidArgument, tt.fragment)
			if got := b.list(); len(got.Endpoints) != 0 {
				t.Fatalf("refused endpoint was stored: %v", got.Endpoints)
			}
		})
	}
	t.Run("a good endpoint is stored with a clamped lease, cluster and node filled from the certificate", func(t *testing.T) {
		e := endpoint("", "", "192.0.2.1", "10.1.0.0/24")
		r, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: e, LeaseSeconds: 3600})
		if err != nil {
			t.Fatal(err)
		}
		if r.LeaseSeconds != int64(DefaultMaxLease/time.Second) || r.Endpoint.Cluster != "east" || r.Endpoint.Node != "gw1" || r.Endpoint.Revision == 0 {
			t.Fatalf("registered %v lease %d; want east/gw1, lease %d, a revision", r.Endpoint, r.LeaseSeconds, int64(DefaultMaxLease/time.Second))
		}
		// Registering the same endpoint again renews the lease without a new revision.
		r2, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: e, LeaseSeconds: 3600})
		if err != nil || r2.Endpoint.Revision != r.Endpoint.Revision {
			t.Fatalf("re-registration: %v, %v; want revision %d unchanged", r2.GetEndpoint(), err, r.Endpoint.Revision)
		}
	})
}

func TestWatchSnapshotThenDeltasAndResume(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	ec := east.client(t, b.addr)
	if _, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1", "10.1.0.0/16")}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(ctxT(t))
	w, err := ec.Watch(ctx, &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Revision 1 is the mesh default policy the broker created at first start; 3 is gw1's
	// certificate record, which agents never see.
	snap := recv(t, w)
	if !snap.Snapshot || snap.Revision != 4 || keys(snap.Events) != "UPSERT:cluster:east@4 UPSERT:endpoint:east/gw1@4 UPSERT:policy:default@4" {
		t.Fatalf("first message: snapshot=%v revision=%d events %s; want a snapshot of east, east/gw1 and the default policy at 4", snap.Snapshot, snap.Revision, keys(snap.Events))
	}
	if snap.Events[1].GetResource().GetEndpoint().GetPrivateIp() != "192.0.2.1" {
		t.Fatalf("snapshot endpoint %v lacks its data", snap.Events[1])
	}
	// Heartbeats are not changes: no message for them.
	if _, err := ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"}); err != nil {
		t.Fatal(err)
	}
	b.token("west", "10.2.0.0/16")
	d := recv(t, w)
	if d.Snapshot || d.Revision != 5 || keys(d.Events) != "UPSERT:cluster:west@5" {
		t.Fatalf("delta: snapshot=%v revision=%d %s; want west at 5", d.Snapshot, d.Revision, keys(d.Events))
	}
	cancel()

	// Changes while the watcher is away; it resumes from revision 5 and gets only those.
	if _, err := b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "west", Set: map[string]string{"env": "prod"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "west"}); err != nil {
		t.Fatal(err)
	}
	w2, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{SinceRevision: 5})
	if err != nil {
		t.Fatal(err)
	}
	r := recv(t, w2)
	if r.Snapshot || r.Revision != 7 || keys(r.Events) != "UPSERT:cluster:west@6 DELETE:cluster:west@7" {
		t.Fatalf("resume from 5: snapshot=%v revision=%d %s; want west label at 6, west delete at 7", r.Snapshot, r.Revision, keys(r.Events))
	}
	if r.Events[0].GetResource().GetCluster().GetLabels()["env"] != "prod" {
		t.Fatalf("label delta lacks the label: %v", r.Events[0])
	}
	// Nothing more is pending: the next message is the next change.
	b.token("north", "10.3.0.0/16")
	if r := recv(t, w2); keys(r.Events) != "UPSERT:cluster:north@8" {
		t.Fatalf("after resume: %s, want north at 8", keys(r.Events))
	}
}

func TestWatchFallsBackToASnapshotWhenTheLogNoLongerHoldsTheRevision(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{storeOpt: store.Options{LogSize: 3}})
	ec := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	for i := 2; i <= 6; i++ {
		b.token(fmt.Sprintf("c%d", i), fmt.Sprintf("10.%d.0.0/16", i))
	}
	w, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{SinceRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r := recv(t, w); !r.Snapshot || len(r.Events) != 7 || r.Revision != 8 {
		t.Fatalf("resume from a compacted revision: snapshot=%v %d events revision %d; want a snapshot of 6 clusters and the default policy", r.Snapshot, len(r.Events), r.Revision)
	}
}

func TestLeaseExpiryWithdrawsTheEndpoint(t *testing.T) {
	clk := newClock()
	b := startBroker(t, t.TempDir(), brokerOpts{clock: clk})
	ec := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	r, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 2})
	if err != nil {
		t.Fatal(err)
	}
	w, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{SinceRevision: r.Endpoint.Revision})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, w); m.Snapshot || len(m.Events) != 0 {
		t.Fatalf("resume at the current revision: %v, want an empty delta", m)
	}
	// A heartbeat moves the lease; the clock passing the old expiry does not reap it.
	clk.Advance(1500 * time.Millisecond)
	hb, err := ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(2 * time.Second); !hb.LeaseExpires.AsTime().Equal(want) {
		t.Fatalf("heartbeat lease expires %v, want %v", hb.LeaseExpires.AsTime(), want)
	}
	// The agent measures its clock skew with the broker's clock in the reply.
	if !hb.BrokerTime.AsTime().Equal(clk.Now()) || hb.BrokerVersion == "" {
		t.Fatalf("heartbeat broker time %v version %q, want the broker clock %v and a version", hb.BrokerTime.AsTime(), hb.BrokerVersion, clk.Now())
	}
	if r.BrokerTime == nil || r.BrokerVersion == "" {
		t.Fatalf("register reply carries no broker time (%v) or version (%q)", r.BrokerTime, r.BrokerVersion)
	}
	clk.Advance(1500 * time.Millisecond)
	b.reap()
	if got := b.list(); len(got.Endpoints) != 1 {
		t.Fatal("endpoint reaped although its heartbeat extended the lease")
	}
	// The reap loop, not the test, withdraws it: the watcher sees the DELETE.
	clk.Advance(time.Second)
	m := recv(t, w)
	if keys(m.Events) != fmt.Sprintf("DELETE:endpoint:east/gw1@%d", r.Endpoint.Revision+1) {
		t.Fatalf("after lease expiry: %s, want a DELETE of east/gw1", keys(m.Events))
	}
	_, err = ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"})
	wantCode(t, err, codes.NotFound, "east/gw1 is not registered", "register it again")
}

func TestAWatcherWhoseClusterIsRemovedIsDisconnected(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ec := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	w, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, w)
	if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "east"}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, w); keys(m.Events) != "DELETE:cluster:east@5" { // 3: gw1's certificate record; 4: its deletion
		t.Fatalf("got %s, want the DELETE of east first", keys(m.Events))
	}
	_, err = w.Recv()
	wantCode(t, err, codes.Unauthenticated, "was removed")
}

func TestLabelAndRemove(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	b.token("east", "10.1.0.0/16")
	c, err := b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"env": "prod", "tier": "1"}})
	if err != nil || c.Labels["env"] != "prod" || c.Labels["tier"] != "1" || c.Revision != 3 {
		t.Fatalf("label: %v, %v", c, err)
	}
	c, err = b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "east", Remove: []string{"tier"}})
	if err != nil || len(c.Labels) != 1 || c.Revision != 4 {
		t.Fatalf("remove label: %v, %v", c, err)
	}
	c, err = b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"env": "prod"}})
	if err != nil || c.Revision != 4 {
		t.Fatalf("a no-op label change got revision %d (%v), want 4 unchanged", c.GetRevision(), err)
	}
	_, err = b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"bad key": "x"}})
	wantCode(t, err, codes.InvalidArgument, `label key "bad key"`)
	_, err = b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "nope", Set: map[string]string{"a": "b"}})
	wantCode(t, err, codes.NotFound, `cluster "nope" not found`)
	_, err = b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, `cluster "nope" not found`)
}
