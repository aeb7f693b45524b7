package bpf

import (
	"encoding/binary"
	"net/netip"
)

// The maps hold addresses as 16 bytes (IPv4 in its IPv4-mapped form) and ports in network
// byte order, as the kernel hands them to the hooks; see c/lb.h.

func addrBytes(a netip.Addr) [16]byte { return a.As16() }

func addrFromBytes(b [16]byte) netip.Addr { return netip.AddrFrom16(b).Unmap() }

// netPort is port as a uint16 field whose memory holds it in network byte order: what the
// kernel stores in a __be16 and the generated Go types decode with the host's byte order.
func netPort(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

// hostPort undoes netPort.
func hostPort(field uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], field)
	return binary.BigEndian.Uint16(b[:])
}
