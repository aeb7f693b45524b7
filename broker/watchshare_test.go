package broker

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// testEncServer is a Server with what encodeBatch needs: a mesh secret and an encoding cache.
func testEncServer(limit int64) *Server {
	return &Server{meshSecret: bytes.Repeat([]byte{7}, 32), watchEnc: newWatchEncodings(limit)}
}

// randomBatch is a batch as the store shares it: clusters (with labels, maps included), endpoints
// with labels, and DELETEs, some of them with a large old value; sometimes a snapshot.
func randomBatch(rng *rand.Rand, clusters []string) *apiv1.WatchResponse {
	resp := &apiv1.WatchResponse{Snapshot: rng.IntN(3) == 0}
	rev := uint64(rng.IntN(1000))
	for i := range rng.IntN(200) {
		rev++
		labels := map[string]string{}
		for j := range rng.IntN(8) {
			labels[fmt.Sprintf("k%d", j)] = strings.Repeat("v", rng.IntN(1500))
		}
		ev := &apiv1.Event{Type: apiv1.Event_UPSERT, Revision: rev}
		switch k := rng.IntN(10); {
		case k < 3:
			c := &apiv1.Cluster{Name: clusters[rng.IntN(len(clusters))], Labels: labels}
			c.Uid = "uid-" + c.Name
			ev.Kind, ev.Key = store.KindCluster, c.Name
			ev.Resource = &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}}
		default:
			e := &apiv1.Endpoint{Cluster: clusters[rng.IntN(len(clusters))], Node: fmt.Sprintf("gw%d", i),
				CablePorts: map[string]uint32{"wireguard": 51820, "vxlan": uint32(rng.IntN(60000))}, PrivateIp: "10.0.0.1", Subnets: []string{"10.1.0.0/16"}}
			if rng.IntN(2) == 0 {
				// The broker's own fields, which agents are not sent.
				e.CertificateSerial, e.LeaseSeconds, e.LeaseExpires = "5a3f9c0e", 30, timestamppb.New(time.Unix(int64(rng.IntN(1e9)), 0))
			}
			ev.Kind, ev.Key = store.KindEndpoint, e.Cluster+"/"+e.Node
			ev.Resource = &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}
		}
		if !resp.Snapshot && rng.IntN(5) == 0 {
			ev.Type = apiv1.Event_DELETE
		}
		resp.Events = append(resp.Events, ev)
	}
	resp.Revision = rev
	if rng.IntN(2) == 0 {
		resp.Ca = &apiv1.CABundle{Pem: bytes.Repeat([]byte("c"), rng.IntN(3000)), IssuingCa: "sha256:x"}
	}
	if rng.IntN(3) == 0 {
		resp.Imports = &apiv1.ServiceImports{}
	}
	return resp
}

// perWatcher is the encoding of resp for a watcher of cluster self the way the broker made it
// before encodings were shared: copies of the clusters, this watcher's PSKs in them, the batch
// split (splitBatch) and each part marshalled on its own.
func perWatcher(t *testing.T, s *Server, resp *apiv1.WatchResponse, self string, budget int) [][]byte {
	t.Helper()
	evs := append([]*apiv1.Event(nil), resp.Events...)
	ownClusters(evs)
	s.addPairPSKs(self, "uid-"+self, evs)
	own := &apiv1.WatchResponse{Snapshot: resp.Snapshot, Events: evs, Revision: resp.Revision, Imports: resp.Imports, Ca: resp.Ca}
	var out [][]byte
	for _, p := range splitBatch(own, budget, slog.New(slog.NewTextHandler(io.Discard, nil))) {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// The bytes a watcher gets from the shared encoding are exactly those the per-watcher encoding
// made (deterministic marshalling, so that maps compare): for watchers of different clusters
// (each with its own pair PSKs), snapshots and deltas, batches split at several budgets, with and
// without imports and the CA bundle. The shared events are never modified.
func TestSharedEncodingIsByteIdenticalToPerWatcher(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	clusters := []string{"east", "west", "north", "south"}
	// A small cache: generations rotate during the test, and what is evicted is encoded again.
	s := testEncServer(64 << 10)
	for round := range 300 {
		budget := []int{400, 2000, 10000, DefaultWatchMessageBytes}[round%4]
		resp := randomBatch(rng, clusters)
		before, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		for _, self := range clusters {
			sameAsPerWatcher(t, s, resp, self, budget)
		}
		after, _ := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
		if !bytes.Equal(before, after) {
			t.Fatalf("round %d: encoding changed the shared batch", round)
		}
	}
}

// sameAsPerWatcher fails t when the shared encoding of resp for a watcher of self differs from
// the per-watcher one.
func sameAsPerWatcher(t *testing.T, s *Server, resp *apiv1.WatchResponse, self string, budget int) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	got, err := s.encodeBatch(resp, watcherOf{cluster: self, clusterUID: "uid-" + self, log: log}, budget)
	if err != nil {
		t.Fatal(err)
	}
	want := perWatcher(t, testEncServer(0), resp, self, budget)
	if len(got) != len(want) {
		t.Fatalf("watcher of %s: %d messages, want %d", self, len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			var g, w apiv1.WatchResponse
			_ = proto.Unmarshal(got[i], &g)
			_ = proto.Unmarshal(want[i], &w)
			t.Fatalf("watcher of %s, message %d of %d (budget %d): %d bytes, want %d\ngot  %v\nwant %v",
				self, i, len(got), budget, len(got[i]), len(want[i]), &g, &w)
		}
	}
}

// FuzzSharedEncoding: batches drawn from the fuzzer's seed, at the budget it picks, encode as the
// per-watcher encoding does.
func FuzzSharedEncoding(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint16(400))
	f.Add(uint64(7), uint64(9), uint16(31<<10))
	clusters := []string{"east", "west"}
	s := testEncServer(32 << 10)
	f.Fuzz(func(t *testing.T, a, b uint64, budget uint16) {
		resp := randomBatch(rand.New(rand.NewPCG(a, b)), clusters)
		for _, self := range clusters {
			sameAsPerWatcher(t, s, resp, self, int(budget))
		}
	})
}

// Agents of different clusters watching the same shared batch each get their own pair PSK on
// every other cluster and none on their own; every endpoint event is encoded once for all the
// watchers, and every cluster event once per watching cluster (not once per watcher).
func TestWatchersOfDifferentClustersShareEncodingsButNotPSKs(t *testing.T) {
	s := testEncServer(watchEncodingBytes)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clusters := []string{"east", "west", "north"}
	var evs []*apiv1.Event
	for i, name := range clusters {
		evs = append(evs, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindCluster, Key: name, Revision: uint64(i + 1),
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: &apiv1.Cluster{Name: name, Uid: "uid-" + name}}}})
	}
	for i := range 50 {
		e := &apiv1.Endpoint{Cluster: clusters[i%3], Node: fmt.Sprintf("gw%d", i), CablePorts: map[string]uint32{"wireguard": 51820, "vxlan": 4789}}
		evs = append(evs, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindEndpoint, Key: e.Cluster + "/" + e.Node,
			Revision: uint64(10 + i), Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}})
	}
	resp := &apiv1.WatchResponse{Snapshot: true, Events: evs, Revision: 59}
	const watchersPerCluster = 20
	for _, self := range clusters {
		for range watchersPerCluster {
			msgs, err := s.encodeBatch(resp, watcherOf{cluster: self, clusterUID: "uid-" + self, log: log}, DefaultWatchMessageBytes)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != 1 {
				t.Fatalf("a batch of %d small events went in %d messages", len(evs), len(msgs))
			}
			var got apiv1.WatchResponse
			if err := proto.Unmarshal(msgs[0], &got); err != nil {
				t.Fatalf("the shared encoding does not decode: %v", err)
			}
			if len(got.Events) != len(evs) || !got.Snapshot || got.Revision != 59 {
				t.Fatalf("watcher of %s got %d events, snapshot %v, revision %d", self, len(got.Events), got.Snapshot, got.Revision)
			}
			for _, c := range clusters {
				psk := clusterPSKs(got.Events)[c]
				want := PairPSK(s.meshSecret, "uid-"+self, "uid-"+c)
				if c == self {
					want = nil
				}
				if !bytes.Equal(psk, want) {
					t.Fatalf("a watcher of %s sees %s with PSK %x, want %x", self, c, psk, want)
				}
			}
		}
	}
	for _, ev := range evs[:3] {
		if ev.GetResource().GetCluster().PairPsk != nil {
			t.Fatalf("a PSK reached the shared cluster %s", ev.Key)
		}
	}
	// 50 endpoints once; 3 clusters for each of 3 watching clusters, of which 3 (their own,
	// without a PSK) share the plain encoding: 3 plain + 6 with a PSK.
	if n, want := s.watchEnc.encoded.Load(), int64(50+3+6); n != want {
		t.Fatalf("%d events encoded for %d watchers, want %d", n, 3*watchersPerCluster, want)
	}
}

// The codec passes an encoded watch message through as it is and encodes everything else as
// protobuf.
func TestWatchCodecPassesEncodedMessagesThrough(t *testing.T) {
	c := newWatchCodec()
	if c.Name() != "proto" {
		t.Fatalf("codec name %q, want proto (the content type clients expect)", c.Name())
	}
	raw := []byte{0x18, 0x07} // revision 7
	data, err := c.Marshal(&encodedWatch{b: raw})
	if err != nil || !bytes.Equal(data.Materialize(), raw) {
		t.Fatalf("encoded message went out as %x, %v; want %x", data.Materialize(), err, raw)
	}
	data, err = c.Marshal(&apiv1.WatchResponse{Revision: 7})
	if err != nil || !bytes.Equal(data.Materialize(), raw) {
		t.Fatalf("WatchResponse encoded as %x, %v; want %x", data.Materialize(), err, raw)
	}
	var got apiv1.WatchResponse
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &got); err != nil || got.Revision != 7 {
		t.Fatalf("unmarshal: %v %v", &got, err)
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Fatal("a string was marshalled")
	}
}

// A delta batch is encoded once for all watchers: two watchers of different clusters send the
// very same bytes for a batch of endpoints, and each watching cluster its own for a batch with a
// cluster UPSERT (its pair PSK); the imports-only events (exports) are not sent at all.
func TestDeltaBatchesAreEncodedOnceForEveryWatcher(t *testing.T) {
	s := testEncServer(watchEncodingBytes)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ep := func(rev uint64) *apiv1.Event {
		e := &apiv1.Endpoint{Cluster: "east", Node: fmt.Sprintf("gw%d", rev), CablePorts: map[string]uint32{"wireguard": 51820}}
		return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindEndpoint, Key: "east/" + e.Node, Revision: rev,
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}}
	}
	endpoints := store.Batch{Events: []*apiv1.Event{ep(5), ep(6)}, Revision: 6}
	cluster := store.Batch{Events: []*apiv1.Event{{Type: apiv1.Event_UPSERT, Kind: store.KindCluster, Key: "north", Revision: 7,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: &apiv1.Cluster{Name: "north", Uid: "uid-north"}}}}}, Revision: 7}
	exports := store.Batch{Events: []*apiv1.Event{{Type: apiv1.Event_UPSERT, Kind: store.KindServiceExport, Key: "east/x", Revision: 8}}, Revision: 8}
	east := watcherOf{cluster: "east", clusterUID: "uid-east", log: log}
	west := watcherOf{cluster: "west", clusterUID: "uid-west", log: log}
	east2 := east

	a, errA := s.sharedDelta(endpoints, east)
	b, errB := s.sharedDelta(endpoints, west)
	if errA != nil || errB != nil || len(a) != 1 || len(b) != 1 || &a[0][0] != &b[0][0] {
		t.Fatalf("an endpoint batch was not shared between watchers of east and west (%v, %v)", errA, errB)
	}
	var got apiv1.WatchResponse
	if err := proto.Unmarshal(a[0], &got); err != nil || keys(got.Events) != "UPSERT:endpoint:east/gw5@5 UPSERT:endpoint:east/gw6@6" || got.Revision != 6 {
		t.Fatalf("shared endpoint batch decodes to %s at %d (%v)", keys(got.Events), got.Revision, err)
	}
	ce, _ := s.sharedDelta(cluster, east)
	ce2, _ := s.sharedDelta(cluster, east2)
	cw, _ := s.sharedDelta(cluster, west)
	if &ce[0][0] != &ce2[0][0] || bytes.Equal(ce[0], cw[0]) {
		t.Fatal("a cluster batch must be shared by the watchers of one cluster and differ between clusters")
	}
	for _, tt := range []struct {
		msg  []byte
		self string
	}{{ce[0], "east"}, {cw[0], "west"}} {
		var r apiv1.WatchResponse
		if err := proto.Unmarshal(tt.msg, &r); err != nil {
			t.Fatal(err)
		}
		if psk := clusterPSKs(r.Events)["north"]; !bytes.Equal(psk, PairPSK(s.meshSecret, "uid-"+tt.self, "uid-north")) {
			t.Fatalf("a watcher of %s got north with PSK %x", tt.self, psk)
		}
	}
	if m, err := s.sharedDelta(exports, east); err != nil || m != nil {
		t.Fatalf("a batch of exports only was encoded: %d messages, %v", len(m), err)
	}
	if n := s.watchBatches.encoded.Load(); n != 3 {
		t.Fatalf("%d batch encodings for 2 batches seen by watchers of 2 clusters, want 3 (endpoints once, the cluster once per watching cluster)", n)
	}
}
