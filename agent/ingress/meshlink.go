package ingress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// MeshLinkName is the link holding a gateway's mesh address. The address must be local (so the
// kernel accepts traffic to it, DNAT in prerouting happens before the routing decision but the
// reply's source must be ours, and SNAT needs a local source) and must not sit on a link that
// carries traffic, hence a link of its own.
const MeshLinkName = "cbl-mesh0"

// EnsureMeshLink makes link cbl-mesh0 exist in the calling thread's network namespace, up, holding
// exactly addr/32 (a stale mesh address from an earlier allocation is removed). Idempotent.
//
// The link is a dummy link; on kernels without the dummy module (this project's CI kernel has
// none) it is a bridge with no ports, which behaves the same for a local /32: the kernel owns the
// address, and nothing is ever forwarded through the link.
func EnsureMeshLink(addr netip.Addr) error {
	if !addr.IsValid() || !addr.Is4() {
		return fmt.Errorf("mesh address %q: must be an IPv4 address", addr)
	}
	link, err := ensureMeshLinkExists()
	if err != nil {
		return err
	}
	want := netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	have, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", MeshLinkName, err)
	}
	present := false
	for _, a := range have {
		if a.IPNet.String() == want.IPNet.String() {
			present = true
			continue
		}
		if a.IP.IsLinkLocalUnicast() && a.IP.To4() == nil {
			continue // the kernel's own IPv6 link-local address: not ours to manage
		}
		if err := netlink.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove stale address %s from %s: %w", a.IPNet, MeshLinkName, err)
		}
	}
	if !present {
		if err := netlink.AddrAdd(link, &want); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add mesh address %s to %s: %w", want.IPNet, MeshLinkName, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", MeshLinkName, err)
		}
	}
	return nil
}

// ensureMeshLinkExists returns cbl-mesh0, creating it (dummy, else port-less bridge) if absent.
// A cbl-mesh0 of another type (not ours: something else took the name) is an error rather than
// deleted, since deleting a link we did not make could cut someone's traffic.
func ensureMeshLinkExists() (netlink.Link, error) {
	link, err := netlink.LinkByName(MeshLinkName)
	if err == nil {
		if t := link.Type(); t != "dummy" && t != "bridge" {
			return nil, fmt.Errorf("link %s exists with type %q, want dummy or bridge: remove it", MeshLinkName, t)
		}
		if br, ok := link.(*netlink.Bridge); ok {
			if n, err := bridgePorts(br); err != nil {
				return nil, err
			} else if n > 0 {
				return nil, fmt.Errorf("link %s is a bridge with %d ports, not a mesh-address link: remove it", MeshLinkName, n)
			}
		}
		return link, nil
	}
	var notFound netlink.LinkNotFoundError
	if !errors.As(err, &notFound) {
		return nil, fmt.Errorf("look up %s: %w", MeshLinkName, err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = MeshLinkName
	if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create dummy link %s: %w", MeshLinkName, err)
		}
		if !errors.Is(err, unix.EEXIST) {
			// No dummy module: a bridge without ports holds a local address just as well.
			if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
				return nil, fmt.Errorf("create bridge link %s (no dummy link support): %w", MeshLinkName, err)
			}
		}
	}
	link, err = netlink.LinkByName(MeshLinkName)
	if err != nil {
		return nil, fmt.Errorf("look up %s after creating it: %w", MeshLinkName, err)
	}
	return link, nil
}

// bridgePorts counts the links enslaved to br.
func bridgePorts(br *netlink.Bridge) (int, error) {
	links, err := nldump.Retry(func() ([]netlink.Link, error) { return netlink.LinkList() })
	if err != nil {
		return 0, fmt.Errorf("list links: %w", err)
	}
	n := 0
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			n++
		}
	}
	return n, nil
}

// RemoveMeshLink deletes cbl-mesh0 if present (the mesh address goes with it). Idempotent.
func RemoveMeshLink() error {
	link, err := netlink.LinkByName(MeshLinkName)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", MeshLinkName, err)
	}
	if t := link.Type(); t != "dummy" && t != "bridge" {
		return fmt.Errorf("link %s has type %q, not a mesh-address link: left in place", MeshLinkName, t)
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("delete %s: %w", MeshLinkName, err)
	}
	return nil
}
