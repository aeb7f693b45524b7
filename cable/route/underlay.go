package route

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/vishvananda/netlink"
)

// FallbackUnderlayMTU is assumed when no local link holds the advertise address (e.g. the
// advertised address is a NAT's public address).
const FallbackUnderlayMTU = 1500

// Underlay is the local link that holds a node's advertise address: what the tunnels run over.
type Underlay struct {
	// Index is the link's index, 0 when no local link holds the address.
	Index int
	// MTU is the link's MTU, FallbackUnderlayMTU when no local link holds the address.
	MTU int
}

// Found reports whether a local link holds the address.
func (u Underlay) Found() bool { return u.Index != 0 }

// FindUnderlay finds the local link holding addr. When there is no address, none holds it (a
// public address behind NAT) or the links cannot be read, it gives the fallback (no link,
// FallbackUnderlayMTU), with a warning for the last two; err is the read error, for a caller
// that cannot go on without knowing the link.
func FindUnderlay(log *slog.Logger, addr netip.Addr) (Underlay, error) {
	fallback := Underlay{MTU: FallbackUnderlayMTU}
	if !addr.IsValid() {
		return fallback, nil
	}
	u, found, err := underlayLink(addr)
	if err != nil {
		log.Warn("find the underlay link, assuming its MTU", "address", addr, "mtu", FallbackUnderlayMTU, "err", err)
		return fallback, err
	}
	if !found {
		log.Warn("advertise address is on no local link, assuming the underlay MTU", "address", addr, "mtu", FallbackUnderlayMTU)
		return fallback, nil
	}
	return u, nil
}

func underlayLink(addr netip.Addr) (Underlay, bool, error) {
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return Underlay{}, false, fmt.Errorf("list addresses to find the link of %s: %w", addr, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != addr.Unmap() {
			continue
		}
		l, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil {
			return Underlay{}, false, fmt.Errorf("find the link of %s (index %d): %w", addr, a.LinkIndex, err)
		}
		return Underlay{Index: a.LinkIndex, MTU: l.Attrs().MTU}, true, nil
	}
	return Underlay{}, false, nil
}
