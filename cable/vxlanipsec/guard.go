package vxlanipsec

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The guard keeps a pair's VXLAN traffic from ever crossing the underlay in the clear. charon
// installs the transport-mode xfrm policies only once the CHILD_SA is up (the responder's
// start_action is none), and removes them when it goes (DPD, a charon restart); without a policy
// the kernel sends and accepts the VXLAN packets as they are. So, before the VXLAN link gets the
// pair's FDB entries, the driver installs two "block" policies of its own for the pair: out,
// local -> remote UDP to the remote's VXLAN port; in, remote -> local UDP to ours. Their
// selectors leave the source port out, so they are not charon's (which name both ports, the
// source being pinned) and charon's never replace them; their priority is far below any charon
// computes (the kernel takes the lowest value first), so charon's policies win whenever they
// exist and the guard decides only when they do not: the packets are then dropped. ESP itself
// (IP protocol 50) and IKE (other ports) match neither.

// guardPriority is the xfrm priority of the guard's policies: larger than any charon gives (its
// range tops out around 300000 for fallback policies), and the mark by which Cleanup knows them.
const guardPriority = 0x7cb00000

// guardSelectors are the two policies of the pair local <-> remote: out to remotePort, in to
// localPort. Pure.
func guardPolicies(local, remote netip.Addr, localPort, remotePort uint16) []netlink.XfrmPolicy {
	host := func(a netip.Addr) *net.IPNet {
		return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
	}
	return []netlink.XfrmPolicy{
		{Src: host(local), Dst: host(remote), Proto: netlink.Proto(unix.IPPROTO_UDP), DstPort: int(remotePort),
			Dir: netlink.XFRM_DIR_OUT, Priority: guardPriority, Action: netlink.XFRM_POLICY_BLOCK},
		{Src: host(remote), Dst: host(local), Proto: netlink.Proto(unix.IPPROTO_UDP), DstPort: int(localPort),
			Dir: netlink.XFRM_DIR_IN, Priority: guardPriority, Action: netlink.XFRM_POLICY_BLOCK},
	}
}

// ensureGuard installs (or updates in place) the pair's guard policies.
func ensureGuard(local, remote netip.Addr, localPort, remotePort uint16) error {
	for _, p := range guardPolicies(local, remote, localPort, remotePort) {
		if err := netlink.XfrmPolicyUpdate(&p); err != nil {
			return fmt.Errorf("install the guard policy %s %s -> %s udp dport %d: %w", dirName(p.Dir), p.Src, p.Dst, p.DstPort, err)
		}
	}
	return nil
}

// removeGuards deletes the guard policies that involve remote (every remote when remote is
// invalid): the pair's, whichever ports they were installed with.
func removeGuards(remote netip.Addr) error {
	ps, err := nldump.Retry(func() ([]netlink.XfrmPolicy, error) { return netlink.XfrmPolicyList(netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list xfrm policies: %w", err)
	}
	var errs []error
	for _, p := range ps {
		if p.Priority != guardPriority || p.Action != netlink.XFRM_POLICY_BLOCK || p.Proto != netlink.Proto(unix.IPPROTO_UDP) {
			continue
		}
		if remote.IsValid() && !isHost(p.Src, remote) && !isHost(p.Dst, remote) {
			continue
		}
		if err := netlink.XfrmPolicyDel(&p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete the guard policy %s %s -> %s: %w", dirName(p.Dir), p.Src, p.Dst, err))
		}
	}
	return errors.Join(errs...)
}

// guardsOf lists the guard policies in place for remote, as "out"/"in" -> present.
func guardsOf(remote netip.Addr) (map[string]bool, error) {
	ps, err := nldump.Retry(func() ([]netlink.XfrmPolicy, error) { return netlink.XfrmPolicyList(netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("list xfrm policies: %w", err)
	}
	out := map[string]bool{}
	for _, p := range ps {
		if p.Priority != guardPriority || p.Action != netlink.XFRM_POLICY_BLOCK {
			continue
		}
		if p.Dir == netlink.XFRM_DIR_OUT && isHost(p.Dst, remote) || p.Dir == netlink.XFRM_DIR_IN && isHost(p.Src, remote) {
			out[dirName(p.Dir)] = true
		}
	}
	return out, nil
}

func isHost(n *net.IPNet, a netip.Addr) bool {
	if n == nil {
		return false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	ones, bits := n.Mask.Size()
	return ok && ip.Unmap() == a.Unmap() && ones == bits && bits > 0
}

func dirName(d netlink.Dir) string {
	switch d {
	case netlink.XFRM_DIR_OUT:
		return "out"
	case netlink.XFRM_DIR_IN:
		return "in"
	}
	return d.String()
}
