package ipsec

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/internal/nldump"
)

// The host side of the traffic-selector addresses (tsaddr.go): TSAddressDevice and what it holds.

// needsTSAddresses says whether charon needs an address in every local traffic selector: our own
// charon with kernel-libipsec, for tunnel-mode connections. Called with d.mu held.
func (d *Driver) needsTSAddresses() bool {
	return d.libipsec && d.cfg.SystemVICI == "" && d.transport == nil
}

// localSubnets are the local traffic selectors of every connection the driver holds, and of
// extra (a connection about to be loaded). Called with d.mu held.
func (d *Driver) localSubnets(extra ...desiredConn) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range d.conns {
		out = append(out, c.want.LocalTS...)
	}
	for _, w := range extra {
		out = append(out, w.LocalTS...)
	}
	return out
}

// ensureTSAddresses makes TSAddressDevice hold the addresses wantedTSAddresses decides for the
// local subnets of the driver's connections (and of extra): it adds what is missing (creating the
// device when it is gone), removes the addresses of subnets no longer local, and deletes the
// device when it holds nothing wanted. An address stays while its subnet is local even when a
// node address now lies in the subnet too (cni0's, once a pod runs on the node): charon's routes
// may carry it as their source, and charon keeps a route as it is while the CHILD_SA lives (the
// kernel keeps a table-220 route whose source address went, measured: it flushes only the main
// table's), so the replies to the gateway's own traffic would come back to an address no longer
// local. It logs each address it adds or removes, once. A no-op without kernel-libipsec. Called
// with d.mu held.
func (d *Driver) ensureTSAddresses(extra ...desiredConn) error {
	if !d.needsTSAddresses() {
		return nil
	}
	held, ours, err := nodeAddresses()
	if err != nil {
		return fmt.Errorf("traffic-selector addresses: %w", err)
	}
	subnets := d.localSubnets(extra...)
	want := wantedTSAddresses(subnets, held)
	keep := keptTSAddresses(subnets)
	if len(want) == 0 && !slices.ContainsFunc(ours, func(a netip.Addr) bool { return keep[a] }) {
		if ours == nil {
			return nil
		}
		return d.removeTSDevice("no local subnet needs an address of it")
	}
	link, err := tsDevice()
	if err != nil {
		return fmt.Errorf("traffic-selector addresses %s: %w", describeTSAddresses(want), err)
	}
	var errs []error
	for _, a := range want {
		if slices.Contains(ours, a.Addr) {
			continue
		}
		if err := addTSAddress(link, a); err != nil {
			errs = append(errs, fmt.Errorf("add address %s on %s for local subnet %s: %w", a.Prefix(), TSAddressDevice, a.Subnet, err))
			continue
		}
		if d.tsAdded[a.Addr] {
			d.log.Warn("put back a traffic-selector address someone deleted", "address", a.Prefix().String(), "subnet", a.Subnet.String(), "device", TSAddressDevice)
			continue
		}
		if d.tsAdded == nil {
			d.tsAdded = map[netip.Addr]bool{}
		}
		d.tsAdded[a.Addr] = true
		d.log.Info("added an address in a local subnet the node holds none in: kernel-libipsec's charon needs one as the source of the route it installs for each CHILD_SA policy",
			"address", a.Prefix().String(), "subnet", a.Subnet.String(), "device", TSAddressDevice)
	}
	for _, a := range ours {
		if keep[a] {
			continue
		}
		p := netip.PrefixFrom(a, a.BitLen())
		if err := netlink.AddrDel(link, &netlink.Addr{IPNet: prefixIPNet(p)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("remove address %s from %s: %w", p, TSAddressDevice, err))
			continue
		}
		delete(d.tsAdded, a)
		d.log.Info("removed a traffic-selector address: its subnet is no longer local", "address", p.String(), "device", TSAddressDevice)
	}
	return errors.Join(errs...)
}

// removeTSDevice deletes TSAddressDevice with its addresses, if it exists. Called with d.mu held
// (or from Cleanup).
func (d *Driver) removeTSDevice(why string) error {
	link, err := netlink.LinkByName(TSAddressDevice)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", TSAddressDevice, err)
	}
	if t := link.Type(); t != "dummy" && t != "bridge" {
		// Not one the driver made (tsDevice refuses to use it): someone else's, left alone.
		return nil
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("delete %s: %w", TSAddressDevice, err)
	}
	d.log.Info("removed the traffic-selector address device", "device", TSAddressDevice, "reason", why)
	return nil
}

// nodeAddresses lists the node's addresses: held on every device but TSAddressDevice, ours on
// it (nil when the device does not exist).
func nodeAddresses() (held, ours []netip.Addr, err error) {
	links, err := nldump.Retry(func() ([]netlink.Link, error) { return netlink.LinkList() })
	if err != nil {
		return nil, nil, fmt.Errorf("list links: %w", err)
	}
	tsIndex := 0
	for _, l := range links {
		if l.Attrs().Name == TSAddressDevice {
			tsIndex = l.Attrs().Index
			ours = []netip.Addr{}
		}
	}
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLinkLocalUnicast() {
			// The kernel gives every device one (IPv6): never ours, and in no subnet of a pair.
			continue
		}
		if tsIndex != 0 && a.LinkIndex == tsIndex {
			ours = append(ours, ip)
		} else {
			held = append(held, ip)
		}
	}
	return held, ours, nil
}

// tsDevice returns TSAddressDevice, created (a dummy device, or a bridge without ports where the
// kernel has no dummy devices) and up. It must be up: the kernel drops the local
// routes of a down device's addresses, and charon's route source must be a local address.
func tsDevice() (netlink.Link, error) {
	link, err := netlink.LinkByName(TSAddressDevice)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		attrs := netlink.NewLinkAttrs()
		attrs.Name = TSAddressDevice
		err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
		if errors.Is(err, unix.EOPNOTSUPP) {
			// No dummy module (this test VM has none): a bridge without ports holds a local
			// address just as well, and nothing ever joins it.
			err = netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create device %s (dummy, or a bridge without ports): %w", TSAddressDevice, err)
		}
		if link, err = netlink.LinkByName(TSAddressDevice); err != nil {
			return nil, fmt.Errorf("look up %s after creating it: %w", TSAddressDevice, err)
		}
	case err != nil:
		return nil, fmt.Errorf("look up %s: %w", TSAddressDevice, err)
	case link.Type() != "dummy" && link.Type() != "bridge":
		return nil, fmt.Errorf("device %s exists with type %q, want dummy (or bridge): remove it", TSAddressDevice, link.Type())
	}
	if link.Attrs().Flags&unix.IFF_UP == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return nil, fmt.Errorf("set %s up: %w", TSAddressDevice, err)
		}
	}
	return link, nil
}

// addTSAddress puts a on link with site scope (see TSAddressDevice) and, for IPv6, without
// duplicate address detection (the address is the subnet's last, which no one else holds, and
// a tentative address could not be a route source yet).
func addTSAddress(link netlink.Link, a tsAddress) error {
	addr := &netlink.Addr{IPNet: prefixIPNet(a.Prefix()), Scope: unix.RT_SCOPE_SITE}
	if a.Addr.Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// describeTSAddresses names each address with its subnet, for errors: "10.96.255.255/32 for
// local subnet 10.96.0.0/16, ...".
func describeTSAddresses(as []tsAddress) string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Prefix().String() + " for local subnet " + a.Subnet.String()
	}
	return strings.Join(out, ", ")
}

// prefixIPNet is p as the net.IPNet netlink takes.
func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// keepTSAddresses is ensureTSAddresses for the keeper, charon's restarts and Disconnect: it puts
// back an address or device someone deleted, and logs a failure (naming the subnet and the
// address) once until it changes or clears. Called with d.mu held.
func (d *Driver) keepTSAddresses() {
	err := d.ensureTSAddresses()
	switch {
	case err == nil && d.tsAddrErr != "":
		d.log.Info("traffic-selector addresses in place again", "device", TSAddressDevice)
		d.tsAddrErr = ""
	case err != nil && err.Error() != d.tsAddrErr:
		d.log.Error("cannot give the node an address in every local subnet: charon refuses the CHILD_SAs whose local subnet has none", "err", err)
		d.tsAddrErr = err.Error()
	}
}
