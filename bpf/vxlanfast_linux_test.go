//go:build linux

package bpf

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// The map entry is what the program reads: addresses, VNI and port in network order.
func TestVXLANRemoteEntry(t *testing.T) {
	f := &VXLANFastPath{ttl: 64, ports: [2]uint16{32768, 60999}}
	mac := net.HardwareAddr{0x02, 0xcb, 240, 1, 2, 3}
	k, v, err := f.entry(7, VXLANRemote{MAC: mac, Remote: netip.MustParseAddr("10.0.0.2"), Local: netip.MustParseAddr("::ffff:10.0.0.1"),
		VNI: 0x123456, DstPort: 4789, Underlay: 3})
	if err != nil {
		t.Fatal(err)
	}
	if k.Ifindex != 7 || net.HardwareAddr(k.Mac[:]).String() != mac.String() {
		t.Errorf("key = %+v, want ifindex 7 and MAC %s", k, mac)
	}
	// Little-endian loads of network-order bytes.
	if v.Remote != 0x0200000a || v.Local != 0x0100000a {
		t.Errorf("remote %#x local %#x, want 0x0200000a and 0x0100000a", v.Remote, v.Local)
	}
	if v.Vni != 0x00563412 { // bytes 12 34 56 00: the VNI, then the reserved byte
		t.Errorf("vni = %#x, want 0x00563412", v.Vni)
	}
	if v.Dport != 0xb512 { // 4789 = 0x12b5
		t.Errorf("dport = %#x, want 0xb512", v.Dport)
	}
	if v.SportMin != 32768 || v.SportMax != 60999 || v.Ttl != 64 || v.Oif != 3 {
		t.Errorf("entry = %+v, want ports 32768-60999, TTL 64, oif 3", v)
	}
}

func TestVXLANRemoteEntryRefusesBadInput(t *testing.T) {
	f := &VXLANFastPath{ttl: 64, ports: [2]uint16{32768, 60999}}
	good := VXLANRemote{MAC: net.HardwareAddr{2, 0xcb, 240, 0, 0, 1}, Remote: netip.MustParseAddr("10.0.0.2"),
		Local: netip.MustParseAddr("10.0.0.1"), VNI: 100, DstPort: 4789, Underlay: 3}
	for _, tt := range []struct {
		name string
		edit func(*VXLANRemote)
		want string
	}{
		{"short MAC", func(r *VXLANRemote) { r.MAC = r.MAC[:4] }, "is not 6 bytes"},
		{"IPv6 remote", func(r *VXLANRemote) { r.Remote = netip.MustParseAddr("fd00::2") }, "both must be IPv4"},
		{"no local", func(r *VXLANRemote) { r.Local = netip.Addr{} }, "both must be IPv4"},
		{"VNI over 24 bits", func(r *VXLANRemote) { r.VNI = 1 << 24 }, "VNI 16777216"},
		{"port 0", func(r *VXLANRemote) { r.DstPort = 0 }, "port 0"},
		{"no underlay", func(r *VXLANRemote) { r.Underlay = 0 }, "underlay link 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.edit(&r)
			if _, _, err := f.entry(1, r); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
