package wireguard

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

func testKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

func pfx(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(s))
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestDesiredFromRemote(t *testing.T) {
	key := testKey(t)
	good := cable.RemoteEndpoint{Cluster: "b", Node: "gw", Address: netip.MustParseAddr("10.0.0.2"), Port: 51820,
		Attributes: map[string]string{AttrPublicKey: key.String()}, Subnets: pfx("10.2.0.0/16", "10.1.0.5/16", "10.2.0.0/16")}
	tests := []struct {
		name    string
		mutate  func(*cable.RemoteEndpoint)
		wantErr string
	}{
		{"a complete remote is accepted", func(*cable.RemoteEndpoint) {}, ""},
		{"an empty cluster is an error", func(r *cable.RemoteEndpoint) { r.Cluster = "" }, "cluster name is empty"},
		{"a bad public key is an error naming it", func(r *cable.RemoteEndpoint) { r.Attributes = map[string]string{AttrPublicKey: "nope"} }, `"nope"`},
		{"a missing address is an error", func(r *cable.RemoteEndpoint) { r.Address = netip.Addr{} }, "address"},
		{"an unspecified address is an error", func(r *cable.RemoteEndpoint) { r.Address = netip.MustParseAddr("0.0.0.0") }, "0.0.0.0"},
		{"port 0 is an error", func(r *cable.RemoteEndpoint) { r.Port = 0 }, "port 0"},
		{"an invalid subnet is an error", func(r *cable.RemoteEndpoint) { r.Subnets = []netip.Prefix{{}} }, "subnet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.mutate(&r)
			got, err := desiredFromRemote(r, 25*time.Second)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := pfx("10.1.0.0/16", "10.2.0.0/16"); !slices.Equal(got.Subnets, want) {
				t.Errorf("subnets = %v, want masked, sorted, deduplicated %v", got.Subnets, want)
			}
			if got.Endpoint.String() != "10.0.0.2:51820" {
				t.Errorf("endpoint = %s", got.Endpoint)
			}
		})
	}
}

func TestPeerMatches(t *testing.T) {
	key := testKey(t)
	want := desiredPeer{PublicKey: key, Endpoint: netip.MustParseAddrPort("10.0.0.2:51820"),
		Subnets: pfx("10.1.0.0/16", "10.2.0.0/16"), Keepalive: 25 * time.Second}
	same := func() wgtypes.Peer {
		return wgtypes.Peer{PublicKey: key, Endpoint: &net.UDPAddr{IP: net.ParseIP("10.0.0.2"), Port: 51820},
			PersistentKeepaliveInterval: 25 * time.Second,
			AllowedIPs:                  []net.IPNet{route.IPNetFromPrefix(pfx("10.2.0.0/16")[0]), route.IPNetFromPrefix(pfx("10.1.0.0/16")[0])}}
	}
	held := func(p *wgtypes.Peer) { p.PersistentKeepaliveInterval, p.Endpoint = 0, nil }
	tests := []struct {
		name   string
		mutate func(*wgtypes.Peer)
		held   bool // compare with want held back
		want   bool
	}{
		{"the same peer with allowed IPs in another order matches", func(*wgtypes.Peer) {}, false, true},
		{"a 16-byte IPv4 endpoint matches", func(p *wgtypes.Peer) { p.Endpoint.IP = net.ParseIP("10.0.0.2").To16() }, false, true},
		{"another key does not match", func(p *wgtypes.Peer) { p.PublicKey = testKey(t) }, false, false},
		{"another endpoint port does not match", func(p *wgtypes.Peer) { p.Endpoint.Port = 1 }, false, false},
		{"no endpoint does not match", func(p *wgtypes.Peer) { p.Endpoint = nil }, false, false},
		{"another keepalive does not match", func(p *wgtypes.Peer) { p.PersistentKeepaliveInterval = 0 }, false, false},
		{"a missing allowed IP does not match", func(p *wgtypes.Peer) { p.AllowedIPs = p.AllowedIPs[:1] }, false, false},
		{"a held-back peer matches without endpoint and keepalive", held, true, true},
		{"a held-back peer matches with the endpoint it learned", func(p *wgtypes.Peer) { p.PersistentKeepaliveInterval = 0 }, true, true},
		{"a fully configured peer does not match a held-back want", func(*wgtypes.Peer) {}, true, false},
		{"a held-back peer does not match a full want", held, false, false},
		{"a held-back peer with a missing allowed IP does not match", func(p *wgtypes.Peer) { held(p); p.AllowedIPs = p.AllowedIPs[:1] }, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := same()
			tt.mutate(&p)
			if got := peerMatches(p, want, tt.held); got != tt.want {
				t.Errorf("peerMatches = %v, want %v", got, tt.want)
			}
		})
	}
}

// Route planning and source choice are tested in cable/route, which this driver uses.

func TestCheckConflicts(t *testing.T) {
	own, kb, kc := testKey(t), testKey(t), testKey(t)
	stored := map[string]storedConn{"b": {PublicKey: kb.String(), Subnets: pfx("10.2.0.0/16")}, "c": {PublicKey: kc.String(), Subnets: pfx("10.3.0.0/16")}}
	tests := []struct {
		name string
		want desiredPeer
		err  string
	}{
		{"a new cluster with its own key and subnets is accepted", desiredPeer{Cluster: "d", PublicKey: testKey(t), Subnets: pfx("10.4.0.0/16")}, ""},
		{"a cluster overlapping its own old subnets is accepted", desiredPeer{Cluster: "b", PublicKey: kb, Subnets: pfx("10.2.0.0/16")}, ""},
		{"a subnet overlapping another cluster's is refused", desiredPeer{Cluster: "d", PublicKey: testKey(t), Subnets: pfx("10.3.1.0/24")},
			"subnet 10.3.1.0/24 overlaps 10.3.0.0/16 of cluster c"},
		{"this node's own key is refused", desiredPeer{Cluster: "d", PublicKey: own, Subnets: pfx("10.4.0.0/16")}, "is this node's own"},
		{"another cluster's key is refused", desiredPeer{Cluster: "d", PublicKey: kc, Subnets: pfx("10.4.0.0/16")}, "is already the peer of cluster c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkConflicts(tt.want, own, stored)
			if (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Errorf("checkConflicts = %v, want %q", err, tt.err)
			}
		})
	}
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	in := map[string]storedConn{"b": {Node: "gw", PublicKey: testKey(t).String(), Endpoint: "10.0.0.2:51820", Subnets: pfx("10.2.0.0/16")}}
	if err := connections(dir).Save(in); err != nil {
		t.Fatal(err)
	}
	out, err := connections(dir).Load()
	if err != nil {
		t.Fatal(err)
	}
	if !storedEqual(in["b"], out["b"]) || len(out) != 1 {
		t.Errorf("round trip: %+v != %+v", out, in)
	}
	empty, err := connections(t.TempDir()).Load()
	if err != nil || len(empty) != 0 {
		t.Errorf("missing file: %v %v, want an empty map", empty, err)
	}
}

func FuzzDecodeStore(f *testing.F) {
	f.Add([]byte(`{"version":1,"connections":{"b":{"node":"gw","publicKey":"x","endpoint":"1.2.3.4:5","subnets":["10.0.0.0/8"]}}}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		conns, err := connections("").Decode(data)
		if err != nil {
			return
		}
		for c, conn := range conns {
			if c == "" {
				t.Fatal("accepted an empty cluster")
			}
			for _, p := range conn.Subnets {
				if !p.IsValid() {
					t.Fatal("accepted an invalid subnet")
				}
			}
		}
	})
}

func TestStaleState(t *testing.T) {
	kb, kc, kx := testKey(t), testKey(t), testKey(t)
	conns := map[string]storedConn{"b": {PublicKey: kb.String()}, "c": {PublicKey: kc.String()}}
	tests := []struct {
		name       string
		onDevice   []wgtypes.Key
		wantRemove []wgtypes.Key
		wantForget []string
	}{
		{"a kept kernel device with exactly the stored peers needs nothing", []wgtypes.Key{kb, kc}, nil, nil},
		{"a peer no cluster claims is removed", []wgtypes.Key{kb, kc, kx}, []wgtypes.Key{kx}, nil},
		{"a fresh userspace device forgets every stored cluster", nil, nil, []string{"b", "c"}},
		{"a cluster whose peer is gone is forgotten and a stranger removed", []wgtypes.Key{kb, kx}, []wgtypes.Key{kx}, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			remove, forget := staleState(tt.onDevice, conns)
			if !slices.Equal(remove, tt.wantRemove) || !slices.Equal(forget, tt.wantForget) {
				t.Errorf("staleState = remove %v forget %v, want %v %v", remove, forget, tt.wantRemove, tt.wantForget)
			}
		})
	}
}

// A gateway-mode pair's LocalSubnets (the gateway's own mesh /32) travel with the peer, so the
// route source is picked inside them rather than inside the node's pod CIDRs; a direct pair has
// none and the node's are used.
func TestDesiredFromRemoteCarriesTheLocalSubnetsOverride(t *testing.T) {
	node := cable.LocalNode{LocalSubnets: pfx("10.40.0.0/16")}
	r := cable.RemoteEndpoint{Cluster: "b", Node: "gw", Address: netip.MustParseAddr("10.0.0.2"), Port: 51820,
		Attributes: map[string]string{AttrPublicKey: testKey(t).String()}, Subnets: pfx("242.0.0.2/32"),
		LocalSubnets: pfx("242.0.0.1/32")}
	got, err := desiredFromRemote(r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if src := (cable.RemoteEndpoint{LocalSubnets: got.LocalSubnets}).SourceSubnets(node); !slices.Equal(src, pfx("242.0.0.1/32")) {
		t.Errorf("source subnets = %v, want the mesh address 242.0.0.1/32", src)
	}
	r.LocalSubnets = nil
	if got, err = desiredFromRemote(r, 0); err != nil {
		t.Fatal(err)
	}
	if src := (cable.RemoteEndpoint{LocalSubnets: got.LocalSubnets}).SourceSubnets(node); !slices.Equal(src, pfx("10.40.0.0/16")) {
		t.Errorf("source subnets = %v, want the node's 10.40.0.0/16", src)
	}
}
