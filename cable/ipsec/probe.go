package ipsec

import (
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
)

// KernelHasESP reports whether the kernel of the current network namespace can hold an ESP SA.
//
// The probe: add an ESP tunnel-mode xfrm state through netlink (AES-CBC with HMAC-SHA256, the
// most widely built algorithms) between two TEST-NET-1 addresses (192.0.2.0/24, never routed),
// with an SPI derived from our pid, and delete it again. A kernel without ESP answers "Requested
// type not found" (it has xfrm but no esp4 type), one without the algorithms "algorithm not
// found"; either way charon could not install SAs there, so the answer is no and the driver uses
// kernel-libipsec. /proc/net/xfrm_stat is not a usable signal: it exists whenever xfrm does, ESP
// or not. The state lives for microseconds and matches no policy, so no traffic is affected.
func KernelHasESP() (bool, error) {
	spi := 0xcb000000 | (os.Getpid() & 0xffffff)
	st := &netlink.XfrmState{
		Src:   net.ParseIP("192.0.2.1").To4(),
		Dst:   net.ParseIP("192.0.2.2").To4(),
		Proto: netlink.XFRM_PROTO_ESP,
		Mode:  netlink.XFRM_MODE_TUNNEL,
		Spi:   spi,
		Auth: &netlink.XfrmStateAlgo{
			Name:        "hmac(sha256)",
			Key:         make([]byte, 32),
			TruncateLen: 128,
		},
		Crypt: &netlink.XfrmStateAlgo{
			Name: "cbc(aes)",
			Key:  make([]byte, 16),
		},
	}
	if err := netlink.XfrmStateAdd(st); err != nil {
		return false, fmt.Errorf("add probe ESP state spi 0x%x: %w", spi, err)
	}
	if err := netlink.XfrmStateDel(st); err != nil {
		return true, fmt.Errorf("ESP works, but deleting the probe state spi 0x%x failed: %w", spi, err)
	}
	return true, nil
}
