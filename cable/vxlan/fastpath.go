package vxlan

import (
	"errors"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/bpf"
)

// The transmit fast path (bpf.VXLANFastPath, setting fastPath): a tcx egress program on each of
// our links encapsulates the packets to the remote VTEPs itself and redirects them to the
// underlay link, skipping the kernel's VXLAN transmit (FDB lookup, outer route, the outer
// packet's netfilter hooks and IP output). It is 7-9 % of a CPU-bound stream on a veth
// underlay (bench/cables.md). Receiving stays the kernel's.
//
// It is only a shortcut: a packet it does not take (no entry, unresolved underlay neighbour)
// goes through the VXLAN device as before, and when it cannot be loaded, or the agent stops,
// the device carries everything. So a failure here is logged, never returned: the cable works
// without it. An embedding driver (vxlan-ipsec) never uses it: its VXLAN packets must go through
// the IPsec policy of the outer route, which a redirect to the underlay link would skip.

// openFastPath loads the fast path when the settings, the embedding and the underlay allow it.
// Called by Init with d.mu held.
func (d *Driver) openFastPath() {
	switch {
	case d.fast != nil:
		return
	case !d.cfg.FastPath:
		d.log.Info("transmit fast path off (setting fastPath: false): the kernel's VXLAN device sends every packet")
		return
	case d.embed != (Embedding{}):
		return
	case d.underlayIndex == 0:
		d.log.Info("transmit fast path off: no local link holds the advertise address, so there is no underlay link to send from")
		return
	}
	f, err := bpf.OpenVXLANFastPath()
	if err != nil {
		d.log.Warn("transmit fast path unavailable: the kernel's VXLAN device sends every packet", "err", err)
		return
	}
	d.fast = f
	d.log.Info("transmit fast path loaded")
}

// syncFastPath makes the fast path hold exactly the remotes of d.conns, on the links they use,
// and leave every other link. Called with d.mu held after every change to d.conns.
func (d *Driver) syncFastPath() {
	if d.fast == nil {
		return
	}
	byDevice := map[string][]bpf.VXLANRemote{}
	for _, c := range d.conns {
		byDevice[c.Device] = append(byDevice[c.Device], bpf.VXLANRemote{
			MAC: VTEPMAC(c.remoteVTEP()), Remote: c.Address, Local: d.src,
			VNI: uint32(c.VNI), DstPort: uint16(c.DstPort), Underlay: d.underlayIndex,
		})
	}
	used := map[int]bool{}
	for dev, rs := range byDevice {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			d.log.Warn("transmit fast path: link not found, the kernel sends its packets", "interface", dev, "err", err)
			continue
		}
		idx := l.Attrs().Index
		used[idx] = true
		if err := d.fast.SetRemotes(idx, rs); err != nil {
			d.log.Warn("transmit fast path: the kernel sends this link's packets", "interface", dev, "err", err)
			continue
		}
		if err := d.fast.Attach(idx); err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) {
				// tcx came in Linux 6.6: say it once, not on every Connect.
				d.log.Warn("transmit fast path unavailable: the kernel's VXLAN device sends every packet", "err", err)
				d.closeFastPath()
				return
			}
			d.log.Warn("transmit fast path: the kernel sends this link's packets", "interface", dev, "err", err)
		}
	}
	for _, idx := range d.fast.Attached() {
		if !used[idx] {
			if err := d.fast.Detach(idx); err != nil {
				d.log.Warn("transmit fast path: detach", "ifindex", idx, "err", err)
			}
		}
	}
}

// closeFastPath detaches the fast path from every link. Called with d.mu held.
func (d *Driver) closeFastPath() {
	if d.fast == nil {
		return
	}
	if err := d.fast.Close(); err != nil {
		d.log.Warn("transmit fast path: close", "err", err)
	}
	d.fast = nil
}

// fastTx is what link ifindex sent through the fast path, which its own counters leave out.
func (d *Driver) fastTx(ifindex int) (packets, bytes uint64) {
	if d.fast == nil {
		return 0, 0
	}
	p, b, err := d.fast.TxCounts(ifindex)
	if err != nil {
		d.log.Warn("transmit fast path: counters", "ifindex", ifindex, "err", err)
	}
	return p, b
}
