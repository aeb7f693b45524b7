package vxlan

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

func pfx(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(s))
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestVTEPAddr(t *testing.T) {
	tests := []struct {
		name, in, want, wantErr string
	}{
		{name: "the first octet is replaced by 240", in: "10.252.0.1", want: "240.252.0.1"},
		{name: "a public address maps the same way", in: "203.0.113.7", want: "240.0.113.7"},
		{name: "an IPv4-mapped IPv6 address is unmapped", in: "::ffff:10.1.2.3", want: "240.1.2.3"},
		{name: "an IPv6 address is an error naming it", in: "fd00::1", wantErr: `"fd00::1" is not IPv4`},
		{name: "an address mapping to the /8 network address is an error", in: "10.0.0.0", wantErr: "network or broadcast"},
		{name: "an address mapping to the /8 broadcast address is an error", in: "10.255.255.255", wantErr: "network or broadcast"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := VTEPAddr(addr(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tt.want || !VTEPPrefix.Contains(got) {
				t.Errorf("VTEPAddr(%s) = %s, want %s inside %s", tt.in, got, tt.want, VTEPPrefix)
			}
		})
	}
	if _, err := VTEPAddr(netip.Addr{}); err == nil {
		t.Error("the zero address was accepted")
	}
}

func TestVTEPMACIsLocallyAdministeredUnicastAndDistinct(t *testing.T) {
	m := VTEPMAC(addr("240.252.0.1"))
	if m.String() != "02:cb:f0:fc:00:01" {
		t.Errorf("VTEPMAC = %s, want 02:cb:f0:fc:00:01", m)
	}
	if m[0]&0x01 != 0 || m[0]&0x02 == 0 {
		t.Errorf("VTEPMAC %s is not a locally administered unicast MAC", m)
	}
	if VTEPMAC(addr("240.252.0.2")).String() == m.String() {
		t.Error("two VTEP addresses got the same MAC")
	}
}

func testConn() conn {
	return conn{Node: "gw", Address: addr("10.252.0.2"), VNI: 100, Port: 4789, DstPort: 4790, MTU: 1450,
		Device: "cbl-vx100", Subnets: pfx("10.253.2.0/24")}
}

func TestValidateRemote(t *testing.T) {
	good := cable.RemoteEndpoint{Cluster: "b", Node: "gw", Address: addr("10.252.0.2"), Port: 4789,
		Subnets: pfx("10.253.2.0/24", "10.253.2.7/24", "10.96.0.0/12")}
	tests := []struct {
		name    string
		mutate  func(*cable.RemoteEndpoint)
		wantErr string
	}{
		{"a complete remote is accepted", func(*cable.RemoteEndpoint) {}, ""},
		{"an empty cluster is an error", func(r *cable.RemoteEndpoint) { r.Cluster = "" }, "cluster name is empty"},
		{"a missing address is an error", func(r *cable.RemoteEndpoint) { r.Address = netip.Addr{} }, "address"},
		{"an unspecified address is an error", func(r *cable.RemoteEndpoint) { r.Address = addr("0.0.0.0") }, "0.0.0.0"},
		{"an IPv6 underlay address is an error", func(r *cable.RemoteEndpoint) { r.Address = addr("fd00::2") }, "not IPv4"},
		{"an IPv6 subnet is an error naming it", func(r *cable.RemoteEndpoint) { r.Subnets = pfx("fd00:2::/64") }, "fd00:2::/64 is IPv6"},
		{"an invalid subnet is an error", func(r *cable.RemoteEndpoint) { r.Subnets = []netip.Prefix{{}} }, "subnet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.mutate(&r)
			got, err := validateRemote(r)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := pfx("10.96.0.0/12", "10.253.2.0/24"); !slices.Equal(got, want) {
				t.Errorf("subnets = %v, want masked, sorted, deduplicated %v", got, want)
			}
		})
	}
}

func TestCheckConflicts(t *testing.T) {
	local := addr("240.252.0.1")
	other := testConn()
	stored := map[string]conn{"b": other}
	tests := []struct {
		name    string
		cluster string
		mutate  func(*conn)
		want    string
	}{
		{"a new remote with its own VTEP and subnets has no conflict", "c",
			func(c *conn) { c.Address = addr("10.252.0.3"); c.Subnets = pfx("10.253.3.0/24") }, ""},
		{"a cluster reconnecting with its own old values has no conflict", "b", func(*conn) {}, ""},
		{"a remote with this node's VTEP is refused", "c",
			func(c *conn) { c.Address = addr("192.252.0.1"); c.Subnets = pfx("10.253.3.0/24") }, "the same as this node's"},
		{"a remote sharing another cluster's VTEP on the same device is refused", "c",
			func(c *conn) { c.Address = addr("172.252.0.2"); c.Subnets = pfx("10.253.3.0/24") }, "already used by cluster b"},
		{"a remote sharing another cluster's VTEP on another device is accepted", "c",
			func(c *conn) {
				c.Address = addr("172.252.0.2")
				c.Device = "cbl-vx200"
				c.VNI = 200
				c.Subnets = pfx("10.253.3.0/24")
			}, ""},
		{"overlapping subnets are refused", "c",
			func(c *conn) { c.Address = addr("10.252.0.3"); c.Subnets = pfx("10.253.0.0/16") }, "overlaps 10.253.2.0/24 of cluster b"},
		{"another (VNI, port) hashed to the same device name is refused", "c",
			func(c *conn) { c.Address = addr("10.252.0.3"); c.Subnets = pfx("10.253.3.0/24"); c.VNI = 7 }, "device cbl-vx100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConn()
			tt.mutate(&c)
			err := checkConflicts(tt.cluster, c, local, stored)
			if (tt.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("checkConflicts = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestWantedEntries(t *testing.T) {
	c := testConn()
	fdb := wantedFDB(c)
	want := []fdbEntry{
		{MAC: zeroMAC, Dst: addr("10.252.0.2"), Port: 4790},
		{MAC: "02:cb:f0:fc:00:02", Dst: addr("10.252.0.2"), Port: 4790},
	}
	if !slices.Equal(fdb, want) {
		t.Errorf("wantedFDB = %v, want %v", fdb, want)
	}
	if n := wantedNeigh(c); n != (neighEntry{IP: addr("240.252.0.2"), MAC: "02:cb:f0:fc:00:02"}) {
		t.Errorf("wantedNeigh = %v", n)
	}
	rs := wantedRoutes(c, addr("10.253.1.1"))
	wantR := []route.Spec{{Dst: pfx("10.253.2.0/24")[0], Gw: addr("240.252.0.2"), Src: addr("10.253.1.1"), MTU: 1450, AdvMSS: 1410}}
	if !slices.Equal(rs, wantR) {
		t.Errorf("wantedRoutes = %+v, want %+v", rs, wantR)
	}
}

func TestPlanFDB(t *testing.T) {
	b0 := fdbEntry{MAC: zeroMAC, Dst: addr("10.252.0.2"), Port: 4789}
	bu := fdbEntry{MAC: "02:cb:f0:fc:00:02", Dst: addr("10.252.0.2"), Port: 4789}
	c0 := fdbEntry{MAC: zeroMAC, Dst: addr("10.252.0.3"), Port: 4789}
	b0Port := b0
	b0Port.Port = 4790
	ownsB := func(e fdbEntry) bool { return e.Dst == addr("10.252.0.2") }
	tests := []struct {
		name             string
		existing, want   []fdbEntry
		owned            func(fdbEntry) bool
		wantAdd, wantDel []fdbEntry
	}{
		{name: "entries in place need nothing", existing: []fdbEntry{b0, bu, c0}, want: []fdbEntry{b0, bu}, owned: ownsB},
		{name: "missing entries are added", existing: []fdbEntry{c0}, want: []fdbEntry{b0, bu}, owned: ownsB, wantAdd: []fdbEntry{b0, bu}},
		{name: "an entry with another port is replaced", existing: []fdbEntry{b0Port, bu}, want: []fdbEntry{b0, bu}, owned: ownsB,
			wantAdd: []fdbEntry{b0}, wantDel: []fdbEntry{b0Port}},
		{name: "Disconnect deletes only the cluster's entries", existing: []fdbEntry{b0, bu, c0}, owned: ownsB, wantDel: []fdbEntry{b0, bu}},
		{name: "a full prune deletes whatever nobody wants", existing: []fdbEntry{b0, bu, c0}, want: []fdbEntry{b0, bu},
			owned: func(fdbEntry) bool { return true }, wantDel: []fdbEntry{c0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			add, del := planFDB(tt.existing, tt.want, tt.owned)
			if !slices.Equal(add, tt.wantAdd) || !slices.Equal(del, tt.wantDel) {
				t.Errorf("planFDB = add %v del %v, want add %v del %v", add, del, tt.wantAdd, tt.wantDel)
			}
		})
	}
}

func TestPlanNeigh(t *testing.T) {
	b := neighEntry{IP: addr("240.252.0.2"), MAC: "02:cb:f0:fc:00:02"}
	bWrongMAC := neighEntry{IP: b.IP, MAC: "aa:bb:cc:dd:ee:ff"}
	c := neighEntry{IP: addr("240.252.0.3"), MAC: "02:cb:f0:fc:00:03"}
	ownsB := func(n neighEntry) bool { return n.IP == b.IP }
	tests := []struct {
		name             string
		existing, want   []neighEntry
		wantSet, wantDel []neighEntry
	}{
		{name: "a neighbor in place needs nothing", existing: []neighEntry{b, c}, want: []neighEntry{b}},
		{name: "a missing neighbor is set", existing: []neighEntry{c}, want: []neighEntry{b}, wantSet: []neighEntry{b}},
		{name: "a neighbor with another MAC is replaced in place, not deleted", existing: []neighEntry{bWrongMAC}, want: []neighEntry{b}, wantSet: []neighEntry{b}},
		{name: "Disconnect deletes only the cluster's neighbor", existing: []neighEntry{b, c}, wantDel: []neighEntry{b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, del := planNeigh(tt.existing, tt.want, ownsB)
			if !slices.Equal(set, tt.wantSet) || !slices.Equal(del, tt.wantDel) {
				t.Errorf("planNeigh = set %v del %v, want set %v del %v", set, del, tt.wantSet, tt.wantDel)
			}
		})
	}
}

func TestPlanDevice(t *testing.T) {
	want := deviceSpec{VNI: 100, Port: 4789, Src: addr("10.252.0.1"), MTU: 1450, MAC: "02:cb:f0:fc:00:01", Up: true,
		Addrs: pfx("240.252.0.1/8")}
	same := func() *deviceSpec { w := want; w.Addrs = slices.Clone(want.Addrs); return &w }
	tests := []struct {
		name   string
		have   *deviceSpec
		mutate func(*deviceSpec)
		want   devicePlan
	}{
		{name: "an absent link is created", want: devicePlan{Create: true}},
		{name: "a matching link needs nothing", have: same(), mutate: func(*deviceSpec) {}},
		{name: "a MAC in upper case still matches", have: same(), mutate: func(d *deviceSpec) { d.MAC = strings.ToUpper(d.MAC) }},
		{name: "another VNI needs a new link", have: same(), mutate: func(d *deviceSpec) { d.VNI = 7 }, want: devicePlan{Recreate: true}},
		{name: "another port needs a new link", have: same(), mutate: func(d *deviceSpec) { d.Port = 4790 }, want: devicePlan{Recreate: true}},
		{name: "learning on needs a new link", have: same(), mutate: func(d *deviceSpec) { d.Learning = true }, want: devicePlan{Recreate: true}},
		{name: "another source needs a new link", have: same(), mutate: func(d *deviceSpec) { d.Src = addr("10.252.0.9") }, want: devicePlan{Recreate: true}},
		{name: "another MTU is set in place", have: same(), mutate: func(d *deviceSpec) { d.MTU = 1500 }, want: devicePlan{SetMTU: true}},
		{name: "a random MAC is replaced in place", have: same(), mutate: func(d *deviceSpec) { d.MAC = "aa:bb:cc:dd:ee:ff" }, want: devicePlan{SetMAC: true}},
		{name: "a link that is down is set up", have: same(), mutate: func(d *deviceSpec) { d.Up = false }, want: devicePlan{SetUp: true}},
		{name: "a stale VTEP address is replaced", have: same(), mutate: func(d *deviceSpec) { d.Addrs = pfx("240.9.9.9/8") },
			want: devicePlan{AddAddrs: pfx("240.252.0.1/8"), DelAddrs: pfx("240.9.9.9/8")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.have != nil {
				tt.mutate(tt.have)
			}
			got := planDevice(tt.have, want)
			if got.Create != tt.want.Create || got.Recreate != tt.want.Recreate || got.SetMTU != tt.want.SetMTU ||
				got.SetMAC != tt.want.SetMAC || got.SetUp != tt.want.SetUp ||
				!slices.Equal(got.AddAddrs, tt.want.AddAddrs) || !slices.Equal(got.DelAddrs, tt.want.DelAddrs) {
				t.Errorf("planDevice = %+v, want %+v", got, tt.want)
			}
			if got.empty() != (tt.have != nil && tt.want.empty()) {
				t.Errorf("empty() = %v for %+v", got.empty(), got)
			}
		})
	}
}

func TestConnState(t *testing.T) {
	tests := []struct {
		name      string
		obs       observation
		wantState cable.State
		wantMsg   string
	}{
		{"everything present is connected", observation{DeviceFound: true, DeviceUp: true}, cable.StateConnected, ""},
		{"a shared device says its counters are shared", observation{DeviceFound: true, DeviceUp: true, SharedWith: 2},
			cable.StateConnected, "shared with 2 other"},
		{"a missing device is an error naming it", observation{}, cable.StateError, "device cbl-vx100 is missing"},
		{"a device down is an error", observation{DeviceFound: true}, cable.StateError, "device cbl-vx100 is down"},
		{"a missing FDB entry is named", observation{DeviceFound: true, DeviceUp: true, MissingFDB: []fdbEntry{{MAC: zeroMAC, Dst: addr("10.252.0.2"), Port: 4789}}},
			cable.StateError, "no FDB entry 00:00:00:00:00:00 dst 10.252.0.2 port 4789"},
		{"a missing neighbor is named", observation{DeviceFound: true, DeviceUp: true, MissingNeigh: []neighEntry{{IP: addr("240.252.0.2"), MAC: "02:cb:f0:fc:00:02"}}},
			cable.StateError, "no neighbor 240.252.0.2 lladdr 02:cb:f0:fc:00:02"},
		{"missing routes are named", observation{DeviceFound: true, DeviceUp: true, MissingRoutes: pfx("10.253.2.0/24")},
			cable.StateError, "no route to 10.253.2.0/24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, msg := connState("cbl-vx100", tt.obs)
			if st != tt.wantState || (tt.wantMsg == "") != (msg == "") || !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("connState = %s %q, want %s %q", st, msg, tt.wantState, tt.wantMsg)
			}
		})
	}
}

func TestParseFDB(t *testing.T) {
	// An RTM_NEWNEIGH body as the kernel sends it for "02:cb:f0:fc:00:02 dst 10.252.0.2 port 4790".
	msg := []byte{
		7, 0, 0, 0, // AF_BRIDGE, pad
		5, 0, 0, 0, // ifindex 5 (little endian: the test machines are)
		0x80, 0, 2, 0, // state NUD_PERMANENT, flags NTF_SELF, type
		10, 0, 2, 0, 0x02, 0xcb, 0xf0, 0xfc, 0x00, 0x02, 0, 0, // NDA_LLADDR (len 10) + padding
		8, 0, 1, 0, 10, 252, 0, 2, // NDA_DST
		6, 0, 6, 0, 0x12, 0xb6, 0, 0, // NDA_PORT 4790 big endian + padding
	}
	e, ok, err := parseFDB(msg, 5, 4789)
	if err != nil || !ok {
		t.Fatalf("parseFDB: %v %v", ok, err)
	}
	if want := (fdbEntry{MAC: "02:cb:f0:fc:00:02", Dst: addr("10.252.0.2"), Port: 4790}); e != want {
		t.Errorf("parseFDB = %v, want %v", e, want)
	}
	if _, ok, _ := parseFDB(msg, 6, 4789); ok {
		t.Error("an entry of another link was returned")
	}
	noPort := msg[:len(msg)-8]
	if e, ok, _ := parseFDB(noPort, 5, 4789); !ok || e.Port != 4789 {
		t.Errorf("an entry without NDA_PORT got port %d, want the device's 4789", e.Port)
	}
	if _, _, err := parseFDB(msg[:5], 5, 4789); err == nil {
		t.Error("a truncated message was accepted")
	}
}

func FuzzParseFDB(f *testing.F) {
	f.Add([]byte{7, 0, 0, 0, 5, 0, 0, 0, 0x80, 0, 2, 0, 10, 0, 2, 0, 2, 0xcb, 0xf0, 0xfc, 0, 2, 0, 0, 8, 0, 1, 0, 10, 252, 0, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		e, ok, err := parseFDB(data, 5, 4789)
		if err != nil || !ok {
			return
		}
		if !e.Dst.IsValid() || len(e.MAC) != 17 {
			t.Fatalf("accepted an entry without destination or MAC: %+v", e)
		}
	})
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	in := map[string]conn{"b": testConn()}
	if err := connections(dir).Save(in); err != nil {
		t.Fatal(err)
	}
	out, err := connections(dir).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || !out["b"].equal(in["b"]) {
		t.Errorf("round trip: %+v != %+v", out, in)
	}
	empty, err := connections(t.TempDir()).Load()
	if err != nil || len(empty) != 0 {
		t.Errorf("missing file: %v %v, want an empty map", empty, err)
	}
}

func FuzzDecodeStore(f *testing.F) {
	f.Add([]byte(`{"version":1,"connections":{"b":{"node":"gw","address":"10.252.0.2","vni":100,"port":4789,"dstPort":4790,"mtu":1450,"device":"cbl-vx100","subnets":["10.253.2.0/24"]}}}`))
	f.Add([]byte(`{"version":1,"connections":{"b":{"address":"fd00::1"}}}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		conns, err := connections("").Decode(data)
		if err != nil {
			return
		}
		for cluster, c := range conns {
			if cluster == "" || c.Device == "" || len(c.Device) > 15 {
				t.Fatalf("accepted cluster %q device %q", cluster, c.Device)
			}
			if _, err := VTEPAddr(c.Address); err != nil {
				t.Fatalf("accepted an address without a VTEP: %v", err)
			}
			for _, p := range c.Subnets {
				if !p.IsValid() || !p.Addr().Is4() {
					t.Fatalf("accepted subnet %v", p)
				}
			}
		}
	})
}

// TestPinnedSourcePortIsPartOfTheDevice: an embedding driver that pins the source port gets a
// link recreated when its range differs; the plain driver (no range wanted) never compares it.
func TestPinnedSourcePortIsPartOfTheDevice(t *testing.T) {
	have := &deviceSpec{VNI: 100, Port: 4799, MTU: 1413, MAC: "02:cb:f0:00:00:01", Up: true}
	pinned := *have
	pinned.SrcPorts = [2]int{4799, 4800}
	if p := planDevice(have, pinned); !p.Recreate {
		t.Errorf("an unpinned link kept for a pinned want: %+v", p)
	}
	same := pinned
	if p := planDevice(&same, pinned); !p.empty() {
		t.Errorf("a pinned link as wanted changes: %+v", p)
	}
	other := *have
	other.SrcPorts = [2]int{32768, 61000}
	if p := planDevice(&other, *have); !p.empty() {
		t.Errorf("the plain driver compares the source ports: %+v", p)
	}
}

// A gateway-mode pair's LocalSubnets (own mesh /32) are part of the stored connection: a change
// of them is a change of the connection (the route source moves), and they survive a restart.
func TestLocalSubnetsArePartOfTheConnection(t *testing.T) {
	a, b := testConn(), testConn()
	b.LocalSubnets = pfx("242.0.0.1/32")
	if a.equal(b) {
		t.Error("connections differing only in LocalSubnets compare equal")
	}
	dir := t.TempDir()
	if err := connections(dir).Save(map[string]conn{"b": b}); err != nil {
		t.Fatal(err)
	}
	out, err := connections(dir).Load()
	if err != nil {
		t.Fatal(err)
	}
	if !out["b"].equal(b) {
		t.Errorf("round trip lost the local subnets: %+v", out["b"])
	}
	if got := (cable.RemoteEndpoint{LocalSubnets: out["b"].LocalSubnets}).SourceSubnets(cable.LocalNode{LocalSubnets: pfx("10.40.0.0/16")}); len(got) != 1 || got[0] != netip.MustParsePrefix("242.0.0.1/32") {
		t.Errorf("source subnets = %v, want the mesh /32", got)
	}
}
