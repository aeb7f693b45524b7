package ipsec

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

var (
	testLocal = cable.LocalNode{
		Cluster: "east", Node: "gw", StateDir: "/nonexistent",
		AdvertiseAddress: netip.MustParseAddr("10.0.0.1"),
		LocalSubnets:     []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
	}
	testKey = []byte("0123456789abcdef0123456789abcdef")
)

func testRemote() cable.RemoteEndpoint {
	return cable.RemoteEndpoint{
		Cluster: "west", Node: "west-gw", Address: netip.MustParseAddr("10.0.0.2"), Port: 500,
		Subnets:      []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("10.3.1.7/16")},
		PreSharedKey: testKey,
	}
}

func defaultOpts(t *testing.T) options {
	t.Helper()
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestDesiredFromRemote(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*cable.LocalNode, *cable.RemoteEndpoint)
		wantErr string
	}{
		{name: "a valid remote is accepted", change: func(*cable.LocalNode, *cable.RemoteEndpoint) {}},
		{name: "an empty cluster name is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Cluster = "" }, wantErr: `remote cluster "": empty`},
		{name: "a cluster name with a space is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Cluster = "we st" }, wantErr: "invalid character ' '"},
		{name: "a missing remote address is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Address = netip.Addr{} }, wantErr: "is not a usable IP"},
		{name: "the node's own address is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Address = testLocal.AdvertiseAddress }, wantErr: "is this node's own advertise address"},
		{name: "mixed address families are refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Address = netip.MustParseAddr("fd00::2") }, wantErr: "different IP families"},
		{name: "a short key is refused without showing it", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.PreSharedKey = []byte("short-secret") }, wantErr: "pre-shared key has 12 bytes, want at least 16"},
		{name: "no remote subnets is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Subnets = nil }, wantErr: "subnets: empty"},
		{name: "an invalid subnet is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) { r.Subnets = []netip.Prefix{{}} }, wantErr: "is not a valid CIDR"},
		{name: "a remote subnet overlapping a local one is refused", change: func(_ *cable.LocalNode, r *cable.RemoteEndpoint) {
			r.Subnets = []netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")}
		}, wantErr: "subnet 10.1.2.0/24 overlaps local subnet 10.1.0.0/16"},
		{name: "no local subnets is refused", change: func(l *cable.LocalNode, _ *cable.RemoteEndpoint) { l.LocalSubnets = nil }, wantErr: "local subnets: empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, r := testLocal, testRemote()
			tt.change(&l, &r)
			got, err := desiredFromRemote(l, r, defaultOpts(t))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), string(r.PreSharedKey)) {
					t.Fatalf("error %q contains the key", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != "cbl-west" || !got.Initiator || got.RemotePort != 500 {
				t.Errorf("got %+v", got)
			}
			// Subnets are masked, sorted and de-duplicated.
			if want := "[10.2.0.0/16 10.3.0.0/16]"; strings.Trim(strings.Join(prefixStrings(got.RemoteTS), " "), " ") != strings.Trim(want, "[]") {
				t.Errorf("remote TS %v, want %s", got.RemoteTS, want)
			}
		})
	}
}

func TestConnMessageForInitiatorAndResponder(t *testing.T) {
	want, err := desiredFromRemote(testLocal, testRemote(), defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	msg := connMessage(want)
	conn := msg["cbl-west"].(map[string]any)
	expect := map[string]any{
		"version":      "2",
		"local_addrs":  []string{"10.0.0.1"},
		"remote_addrs": []string{"10.0.0.2"},
		"remote_port":  "500",
		"proposals":    []string{DefaultIKEProposals},
		"encap":        "yes",
		"unique":       "replace",
		"keyingtries":  "0",
		"dpd_delay":    "10s",
		"mobike":       "no",
		"local":        map[string]any{"auth": "psk", "id": "10.0.0.1"},
		"remote":       map[string]any{"auth": "psk", "id": "10.0.0.2"},
		"children": map[string]any{"cbl-west": map[string]any{
			"mode":          "tunnel",
			"local_ts":      []string{"10.1.0.0/16"},
			"remote_ts":     []string{"10.2.0.0/16", "10.3.0.0/16"},
			"esp_proposals": []string{DefaultESPProposals},
			"start_action":  "start",
			"dpd_action":    "restart",
			// Not start: the keeper re-initiates after a peer's delete, once our own
			// agent has had time to remove a connection that is going away.
			"close_action": "none",
		}},
	}
	if !reflect.DeepEqual(conn, expect) {
		t.Errorf("load-conn for the initiator:\n got %#v\nwant %#v", conn, expect)
	}
	if _, err := toMessage(msg); err != nil {
		t.Errorf("the message does not encode for VICI: %v", err)
	}

	// The other end of the same pair responds only.
	remoteSide := cable.LocalNode{Cluster: "west", AdvertiseAddress: netip.MustParseAddr("10.0.0.2"), LocalSubnets: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}}
	back, err := desiredFromRemote(remoteSide, cable.RemoteEndpoint{Cluster: "east", Address: testLocal.AdvertiseAddress, Subnets: testLocal.LocalSubnets, PreSharedKey: testKey}, defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	child := connMessage(back)["cbl-east"].(map[string]any)["children"].(map[string]any)["cbl-east"].(map[string]any)
	if child["start_action"] != "none" || child["dpd_action"] != "clear" || child["close_action"] != "none" {
		t.Errorf("responder child %v, want start_action none, dpd_action clear, close_action none", child)
	}

	// No secret in the connection, in any part.
	if strings.Contains(fingerprintInput(msg), string(testKey)) {
		t.Errorf("load-conn message contains the key")
	}
	shared := sharedMessage(want, "cbl-west#0123", testKey)
	if shared["data"] != string(testKey) || shared["type"] != "IKE" || shared["id"] != "cbl-west#0123" ||
		!reflect.DeepEqual(shared["owners"], []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("load-shared message %v", redact(shared))
	}
}

func fingerprintInput(m map[string]any) string {
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			b.WriteString(x)
		case []string:
			b.WriteString(strings.Join(x, ","))
		case map[string]any:
			for k, v := range x {
				b.WriteString(k)
				walk(v)
			}
		}
	}
	walk(m)
	return b.String()
}

func redact(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	out["data"] = "<redacted>"
	return out
}

func TestInitiatorIsExactlyOneEndOfEveryPair(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randAddr := func() netip.Addr {
		if rng.IntN(2) == 0 {
			var b [4]byte
			for i := range b {
				b[i] = byte(rng.IntN(4)) // small space: many near-equal addresses
			}
			return netip.AddrFrom4(b)
		}
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.IntN(3))
		}
		return netip.AddrFrom16(b)
	}
	for i := 0; i < 10000; i++ {
		a, b := randAddr(), randAddr()
		if a == b {
			continue
		}
		if isInitiator(a, b) == isInitiator(b, a) {
			t.Fatalf("%s and %s both compute initiator=%v", a, b, isInitiator(a, b))
		}
	}
	// A v4-mapped address is the same end as its v4 form.
	if isInitiator(netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("10.0.0.2")) != isInitiator(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")) {
		t.Errorf("v4-mapped and plain addresses disagree")
	}
}

func TestFingerprintChangesWithTheConfiguration(t *testing.T) {
	want, err := desiredFromRemote(testLocal, testRemote(), defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	fp := fingerprint(connMessage(want))
	if fp != fingerprint(connMessage(want)) {
		t.Fatal("fingerprint is not stable")
	}
	changed := want
	changed.RemoteTS = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
	if fingerprint(connMessage(changed)) == fp {
		t.Error("changed subnets keep the fingerprint")
	}
	changed = want
	changed.Opts.Encap = false
	if fingerprint(connMessage(changed)) == fp {
		t.Error("changed encap keeps the fingerprint")
	}
}

func TestLoadedMatches(t *testing.T) {
	want, err := desiredFromRemote(testLocal, testRemote(), defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	// As list-conns reports it (keys of strongSwan 5.9).
	loaded := map[string]any{
		"local_addrs":  []string{"10.0.0.1"},
		"remote_addrs": []string{"10.0.0.2"},
		"version":      "IKEv2",
		"children": map[string]any{"cbl-west": map[string]any{
			"mode":      "TUNNEL",
			"local-ts":  []string{"10.1.0.0/16"},
			"remote-ts": []string{"10.3.0.0/16", "10.2.0.0/16"},
		}},
	}
	if !loadedMatches(loaded, want) {
		t.Error("matching connection (selectors in another order) reported as different")
	}
	loaded["remote_addrs"] = []string{"10.0.0.3"}
	if loadedMatches(loaded, want) {
		t.Error("other remote address reported as matching")
	}
	loaded["remote_addrs"] = []string{"10.0.0.2"}
	loaded["children"].(map[string]any)["cbl-west"].(map[string]any)["remote-ts"] = []string{"10.2.0.0/16"}
	if loadedMatches(loaded, want) {
		t.Error("missing remote selector reported as matching")
	}
	delete(loaded, "children")
	if loadedMatches(loaded, want) {
		t.Error("connection without the child reported as matching")
	}
}

func TestTunnelMTU(t *testing.T) {
	tests := []struct {
		name               string
		setting, underlay  int
		libipsec, v6, aead bool
		want               int
		wantErr            string
	}{
		{name: "kernel ESP with AES-GCM over IPv4 leaves room for a 1428-byte packet", underlay: 1500, aead: true, want: 1435},
		{name: "kernel ESP with AES-GCM over IPv6 pays 20 more", underlay: 1500, aead: true, v6: true, want: 1415},
		{name: "kernel ESP with CBC and HMAC pays the worst padding and ICV", underlay: 1500, want: 1399},
		{name: "libipsec is capped at its TUN read size", underlay: 1500, libipsec: true, aead: true, want: LibipsecMTU},
		{name: "libipsec on a jumbo underlay is still capped", underlay: 9000, libipsec: true, aead: true, want: LibipsecMTU},
		{name: "a small underlay is clamped to the IPv6 minimum", underlay: 1300, aead: true, want: MinMTU},
		{name: "an explicit setting wins", setting: 1350, underlay: 1500, libipsec: true, want: 1350},
		{name: "an explicit setting above libipsec's limit is refused", setting: 1450, underlay: 1500, libipsec: true, wantErr: "ipsec.mtu: 1450 is more than kernel-libipsec carries (at most 1400-byte packets)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tunnelMTU(tt.setting, tt.underlay, tt.libipsec, tt.v6, tt.aead)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
	if got := mssFor(1400, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); got != 1360 {
		t.Errorf("IPv4 MSS %d, want 1360", got)
	}
	if got := mssFor(1400, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}); got != 1340 {
		t.Errorf("dual-stack MSS %d, want 1340", got)
	}
	if !allAEAD([]string{DefaultESPProposals}) || allAEAD([]string{DefaultESPProposals, "aes128-sha256"}) || allAEAD(nil) {
		t.Error("allAEAD misjudges the proposals")
	}
}

func TestRenderConf(t *testing.T) {
	p := confParams{Port: 500, NATTPort: 4500, ViciSocket: "/var/lib/cablemesh/ipsec/charon.vici", MTU: 1400, MSS: 1360}
	kernel := renderConf(p)
	p.Libipsec = true
	lib := renderConf(p)
	for _, s := range []string{"port = 500", "port_nat_t = 4500", "socket = unix:///var/lib/cablemesh/ipsec/charon.vici", "mtu = 1400", "mss = 1360", "install_routes = yes", "default = 1"} {
		if !strings.Contains(kernel, s) || !strings.Contains(lib, s) {
			t.Errorf("strongswan.conf lacks %q", s)
		}
	}
	if strings.Contains(kernel, "kernel-libipsec") {
		t.Error("kernel datapath loads kernel-libipsec")
	}
	// The first IPsec backend loaded wins: libipsec must come before kernel-netlink.
	if i, j := strings.Index(lib, "kernel-libipsec"), strings.Index(lib, "kernel-netlink"); i < 0 || i > j {
		t.Errorf("kernel-libipsec (at %d) must be loaded before kernel-netlink (at %d)", i, j)
	}
	if strings.Contains(lib, "include") {
		t.Error("strongswan.conf includes other files: the host's configuration would leak in")
	}
}

// A gateway-mode pair's LocalSubnets replace the node's pod CIDRs as the local traffic selectors:
// the SA carries only the two mesh addresses. Transport mode ignores them (it protects the
// underlay hosts).
func TestLocalSubnetsOverrideTheLocalTrafficSelectors(t *testing.T) {
	r := testRemote()
	r.Subnets = []netip.Prefix{netip.MustParsePrefix("242.0.0.2/32")}
	r.LocalSubnets = []netip.Prefix{netip.MustParsePrefix("242.0.0.1/32")}
	got, err := desiredFromRemote(testLocal, r, defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("242.0.0.1/32")}; !reflect.DeepEqual(got.LocalTS, want) {
		t.Errorf("local TS = %v, want %v", got.LocalTS, want)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("242.0.0.2/32")}; !reflect.DeepEqual(got.RemoteTS, want) {
		t.Errorf("remote TS = %v, want %v", got.RemoteTS, want)
	}
	tr, err := desiredTransport(testLocal, r, defaultOpts(t), "udp", TransportPorts{Local: 4799, Remote: 4800})
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}; !reflect.DeepEqual(tr.LocalTS, want) {
		t.Errorf("transport local TS = %v, want the underlay host %v", tr.LocalTS, want)
	}
}
