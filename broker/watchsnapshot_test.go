package broker

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/broker/store"
)

// bigSnapshot is a snapshot as the store shares it: clusters first, then endpoints and policies,
// every event at the snapshot's revision.
func bigSnapshot(rng *rand.Rand, clusters []string, endpoints int) store.Batch {
	const rev = 900
	var evs []*apiv1.Event
	for _, name := range clusters {
		c := &apiv1.Cluster{Name: name, Uid: "uid-" + name, Labels: map[string]string{"env": strings.Repeat("p", rng.IntN(40))}}
		evs = append(evs, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindCluster, Key: name, Revision: rev,
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}}})
	}
	for i := range endpoints {
		e := &apiv1.Endpoint{Cluster: clusters[rng.IntN(len(clusters))], Node: fmt.Sprintf("gw%d", i), PrivateIp: "10.0.0.1",
			CablePorts: map[string]uint32{"wireguard": 51820, "vxlan": uint32(rng.IntN(60000))}, Subnets: []string{"10.1.0.0/16"}}
		evs = append(evs, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindEndpoint, Key: e.Cluster + "/" + e.Node, Revision: rev,
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}})
	}
	evs = append(evs, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindPolicy, Key: "default", Revision: rev,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: &apiv1.Policy{Name: "default"}}}})
	return store.Batch{Snapshot: true, Revision: rev, Events: evs}
}

// joinMessages decodes msgs and joins them as the agent does (agent.joinWatchParts).
func joinMessages(t *testing.T, msgs [][]byte) *apiv1.WatchResponse {
	t.Helper()
	out := &apiv1.WatchResponse{}
	for i, m := range msgs {
		p := decodeMessage(t, i, m)
		out.Snapshot = out.Snapshot || p.Snapshot
		out.Events = append(out.Events, p.Events...)
		out.Revision = p.Revision
		if p.Imports != nil {
			out.Imports = p.Imports
		}
		if p.Ca != nil {
			out.Ca = p.Ca
		}
	}
	return out
}

// decodeMessage decodes message i, expanding it when it is compressed (as the agent does).
func decodeMessage(t *testing.T, i int, m []byte) *apiv1.WatchResponse {
	t.Helper()
	var p apiv1.WatchResponse
	if err := proto.Unmarshal(m, &p); err != nil {
		t.Fatalf("message %d does not decode: %v", i, err)
	}
	if err := watchzstd.Expand(&p); err != nil {
		t.Fatalf("message %d does not expand: %v", i, err)
	}
	return &p
}

// checkFraming fails t unless msgs are framed as a snapshot in parts: snapshot on the first
// message only, more on all but the last, none over budget.
func checkFraming(t *testing.T, msgs [][]byte, budget int) {
	t.Helper()
	for i, m := range msgs {
		if len(m) > budget {
			t.Fatalf("message %d of %d: %d bytes, over the budget of %d", i, len(msgs), len(m), budget)
		}
		p := decodeMessage(t, i, m)
		if len(p.Encoded) > 0 {
			t.Fatalf("message %d: still encoded after expanding", i)
		}
		if p.Snapshot != (i == 0) || p.More != (i < len(msgs)-1) {
			t.Fatalf("message %d of %d: snapshot %v, more %v", i, len(msgs), p.Snapshot, p.More)
		}
	}
}

// sameState fails t unless a and b hold the same resources (events by kind and key; their own
// revisions aside, which only the parts of a snapshot decide), revision, imports and CA.
func sameState(t *testing.T, what string, got, want *apiv1.WatchResponse) {
	t.Helper()
	key := func(evs []*apiv1.Event) []string {
		var out []string
		for _, ev := range evs {
			r, _ := proto.MarshalOptions{Deterministic: true}.Marshal(ev.Resource)
			out = append(out, fmt.Sprintf("%s %s %s %x", ev.Type, ev.Kind, ev.Key, r))
		}
		sort.Strings(out)
		return out
	}
	g, w := key(got.Events), key(want.Events)
	if strings.Join(g, "\n") != strings.Join(w, "\n") {
		t.Fatalf("%s: %d events, want %d; they differ", what, len(g), len(w))
	}
	if got.Revision != want.Revision || got.Snapshot != want.Snapshot || !proto.Equal(got.Imports, want.Imports) || !proto.Equal(got.Ca, want.Ca) {
		t.Fatalf("%s: revision %d snapshot %v imports %v ca %v, want %d %v %v %v", what, got.Revision, got.Snapshot, got.Imports, got.Ca,
			want.Revision, want.Snapshot, want.Imports, want.Ca)
	}
}

// A large snapshot is encoded once for all its watchers but for their clusters (their PSKs),
// imports and CA bundle: joined, what each watcher gets is the snapshot the per-watcher encoding
// makes, every message within the budget, and the parts in between are the same bytes for all.
func TestASnapshotIsEncodedOnceForAllItsWatchers(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	clusters := []string{"east", "west", "north", "south"}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, budget := range []int{2000, 10000, DefaultWatchMessageBytes} {
		for _, n := range []int{3, 400, 3000} {
			for _, zstd := range []bool{false, true} {
				t.Run(fmt.Sprintf("budget %d, %d endpoints, zstd %v", budget, n, zstd), func(t *testing.T) {
					s := testEncServer(watchEncodingBytes)
					snap := bigSnapshot(rng, clusters, n)
					var shared [][]byte
					for i, self := range clusters {
						resp := &apiv1.WatchResponse{Snapshot: true, Revision: snap.Revision, Events: snap.Events}
						switch i % 3 {
						case 1:
							resp.Imports = &apiv1.ServiceImports{Imports: []*apiv1.ServiceImport{{Namespace: "shop", Name: "web", Vips: []string{"241.0.0.1"}}}}
							resp.Ca = &apiv1.CABundle{Pem: []byte("small CA"), IssuingCa: "sha256:x"}
						case 2:
							// Too large to go beside the last events: a message of its own.
							resp.Ca = &apiv1.CABundle{Pem: bytes.Repeat([]byte("c"), budget-200), IssuingCa: "sha256:x"}
						}
						w := watcherOf{cluster: self, clusterUID: "uid-" + self, log: log, zstd: zstd}
						msgs, err := s.encodeSnapshot(snap, resp, w, budget)
						if err != nil {
							t.Fatal(err)
						}
						plain := perWatcher(t, testEncServer(0), resp, self, budget)
						want := joinMessages(t, plain)
						checkFraming(t, msgs, budget)
						sameState(t, "watcher of "+self, joinMessages(t, msgs), want)
						// The parts after the clusters and before the last are shared: the same
						// backing bytes for every watcher (compressed once, for those that accept
						// zstd).
						e := s.sharedSnapshot(snap, w, budget)
						if e.small {
							continue
						}
						if zstd {
							if got, was := totalBytes(msgs), totalBytes(plain); got*4 > was*3 {
								t.Fatalf("compressed, the snapshot is %d bytes, %d uncompressed: want at most three quarters", got, was)
							}
						}
						if i == 0 {
							shared = e.shared
							if zstd {
								shared, _ = e.compressed()
							}
						}
						found := 0
						for _, m := range msgs {
							for _, sm := range shared {
								if len(m) > 0 && len(sm) > 0 && &m[0] == &sm[0] {
									found++
								}
							}
						}
						if found != len(shared) {
							t.Fatalf("watcher of %s sent %d of the %d shared parts as they are", self, found, len(shared))
						}
					}
					if got := s.watchSnapshots.encoded.Load(); got != 1 {
						t.Fatalf("the snapshot was encoded %d times for %d watchers, want once", got, len(clusters))
					}
					if small := s.sharedSnapshot(snap, watcherOf{log: log}, budget).small; small != (n == 3) {
						t.Fatalf("%d endpoints at a budget of %d: small %v", n, budget, small)
					}
				})
			}
		}
	}
}

func totalBytes(msgs [][]byte) int {
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	return n
}

// An agent's watch carries endpoints without what only the broker uses (the certificate an
// endpoint is bound to, its lease and last heartbeat); the admin API lists them.
func TestAgentsAreNotSentTheBrokersOwnEndpointFields(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ag := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	c := ag.client(t, b.addr)
	if _, err := c.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 30}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got *apiv1.Endpoint
	for _, ev := range recv(t, w).Events {
		if e := ev.GetResource().GetEndpoint(); e != nil {
			got = e
		}
	}
	if got == nil || got.PrivateIp != "192.0.2.1" || got.Revision == 0 || got.MeshAddress == "" {
		t.Fatalf("the watch's endpoint %v, want east/gw1 at 192.0.2.1 with its revision and mesh address", got)
	}
	if got.CertificateSerial != "" || got.LeaseExpires != nil || got.LastHeartbeat != nil || got.LeaseSeconds != 0 {
		t.Fatalf("the watch sent the broker's own fields: %v", got)
	}
	l, err := b.admin.ListClusters(ctxT(t), &apiv1.ListClustersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Endpoints) != 1 || l.Endpoints[0].CertificateSerial == "" || l.Endpoints[0].LeaseExpires == nil || l.Endpoints[0].LeaseSeconds != 30 {
		t.Fatalf("ListClusters: %v, want the endpoint with its certificate serial and lease", l.Endpoints)
	}
}
