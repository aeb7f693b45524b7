package bpf

import (
	"testing"
	"unsafe"
)

func TestPortsAreHeldInNetworkByteOrder(t *testing.T) {
	v := netPort(0x1f90) // 8080
	b := (*[2]byte)(unsafe.Pointer(&v))
	if b[0] != 0x1f || b[1] != 0x90 {
		t.Errorf("netPort(8080) in memory: % x, want 1f 90", b[:])
	}
	if hostPort(v) != 8080 {
		t.Errorf("hostPort(netPort(8080)) = %d", hostPort(v))
	}
}

func TestIPv4AddressesAreHeldInTheirIPv4MappedForm(t *testing.T) {
	b := addrBytes(ip("241.0.0.1"))
	want := [16]byte{10: 0xff, 11: 0xff, 12: 241, 15: 1}
	if b != want {
		t.Errorf("addrBytes(241.0.0.1) = % x, want % x", b, want)
	}
	if a := addrFromBytes(b); a != ip("241.0.0.1") {
		t.Errorf("addrFromBytes: %s, want 241.0.0.1", a)
	}
	if a := addrFromBytes(addrBytes(ip("fd00::1"))); a != ip("fd00::1") {
		t.Errorf("IPv6 round trip: %s", a)
	}
}
