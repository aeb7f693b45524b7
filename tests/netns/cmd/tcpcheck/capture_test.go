package main

import (
	"net/netip"
	"testing"
)

func TestIPv4Addrs(t *testing.T) {
	hdr := []byte{0x45, 0, 0, 20, 0, 0, 0, 0, 64, 6, 0, 0, 242, 0, 0, 1, 242, 0, 0, 2}
	src, dst, ok := ipv4Addrs(hdr)
	if !ok || src != netip.MustParseAddr("242.0.0.1") || dst != netip.MustParseAddr("242.0.0.2") {
		t.Errorf("ipv4Addrs = %v %v %v", src, dst, ok)
	}
	if _, _, ok := ipv4Addrs(hdr[:19]); ok {
		t.Error("a truncated header was read")
	}
	v6 := append([]byte{0x60}, hdr[1:]...)
	if _, _, ok := ipv4Addrs(v6); ok {
		t.Error("an IPv6 packet was read as IPv4")
	}
}

// The capture reads whatever the link carries: no input may panic it.
func FuzzIPv4Addrs(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 20, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		src, dst, ok := ipv4Addrs(p)
		if ok && (!src.Is4() || !dst.Is4()) {
			t.Fatalf("accepted non-IPv4 addresses %v %v", src, dst)
		}
	})
}
