package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// FDB entries of a VXLAN device through raw rtnetlink. netlink.Neigh has no field for NDA_PORT,
// and the destination port is what lets a node listening on one port reach a remote that
// publishes another; so the FDB messages are built here (the same ones `bridge fdb append ... dst
// IP port P self permanent` sends).

const ndmsgLen = 12 // struct ndmsg: family u8, pad u8, pad u16, ifindex s32, state u16, flags u8, type u8

// listFDB dumps the FDB entries with a remote destination on the link. The kernel reports no
// NDA_PORT for entries using the device's own port: they get devicePort.
func listFDB(linkIndex, devicePort int) ([]fdbEntry, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
	req.AddData(&netlink.Ndmsg{Family: unix.AF_BRIDGE, Index: uint32(linkIndex)})
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("dump FDB: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("dump FDB: interrupted by a concurrent change, retry: %w", err)
	}
	var out []fdbEntry
	for _, m := range msgs {
		e, ok, err := parseFDB(m, linkIndex, devicePort)
		if err != nil {
			return nil, fmt.Errorf("dump FDB: %w", err)
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// parseFDB decodes one RTM_NEWNEIGH message. ok is false for messages of other links or families
// and for entries without a remote destination (the device's own unicast/multicast addresses).
func parseFDB(m []byte, linkIndex, devicePort int) (fdbEntry, bool, error) {
	if len(m) < ndmsgLen {
		return fdbEntry{}, false, fmt.Errorf("neighbor message of %d bytes, shorter than ndmsg", len(m))
	}
	family := m[0]
	index := int(int32(nl.NativeEndian().Uint32(m[4:8])))
	if family != unix.AF_BRIDGE || index != linkIndex {
		return fdbEntry{}, false, nil
	}
	attrs, err := parseAttrs(m[ndmsgLen:])
	if err != nil {
		return fdbEntry{}, false, err
	}
	e := fdbEntry{Port: devicePort}
	var haveMAC bool
	for _, a := range attrs {
		switch a.Type {
		case netlink.NDA_LLADDR:
			if len(a.Value) == 6 {
				e.MAC, haveMAC = canonicalMAC(a.Value), true
			}
		case netlink.NDA_DST:
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				e.Dst = ip.Unmap()
			}
		case netlink.NDA_PORT:
			if len(a.Value) == 2 {
				e.Port = int(binary.BigEndian.Uint16(a.Value))
			}
		}
	}
	if !haveMAC || !e.Dst.IsValid() {
		return fdbEntry{}, false, nil
	}
	return e, true, nil
}

// rtAttr is one netlink attribute.
type rtAttr struct {
	Type  uint16
	Value []byte
}

// parseAttrs splits a run of netlink attributes, checking every length against the buffer
// (nl.ParseRouteAttr panics on a length that runs past it).
func parseAttrs(b []byte) ([]rtAttr, error) {
	var out []rtAttr
	for len(b) >= 4 {
		l := int(nl.NativeEndian().Uint16(b[0:2]))
		typ := nl.NativeEndian().Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < 4 || l > len(b) {
			return nil, fmt.Errorf("attribute of type %d claims %d bytes, %d left", typ, l, len(b))
		}
		out = append(out, rtAttr{Type: typ, Value: b[4:l]})
		next := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if next > len(b) {
			break // the last attribute needs no padding
		}
		b = b[next:]
	}
	return out, nil
}

// fdbRequest builds an RTM_NEWNEIGH/RTM_DELNEIGH for one entry (permanent, on the device itself).
func fdbRequest(proto, flags, linkIndex int, e fdbEntry) (*nl.NetlinkRequest, error) {
	mac, err := net.ParseMAC(e.MAC)
	if err != nil {
		return nil, fmt.Errorf("FDB entry %s: %w", e, err)
	}
	req := nl.NewNetlinkRequest(proto, flags|unix.NLM_F_ACK)
	req.AddData(&netlink.Ndmsg{Family: unix.AF_BRIDGE, Index: uint32(linkIndex), State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF})
	req.AddData(nl.NewRtAttr(netlink.NDA_LLADDR, mac))
	req.AddData(nl.NewRtAttr(netlink.NDA_DST, e.Dst.AsSlice()))
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(e.Port))
	req.AddData(nl.NewRtAttr(netlink.NDA_PORT, port))
	return req, nil
}

// addFDB installs e. The zero MAC is appended (one remote more for head-end replication); a
// unicast MAC is created or replaced (one destination per MAC).
func addFDB(linkIndex int, e fdbEntry) error {
	mode := unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	if e.MAC == zeroMAC {
		mode = unix.NLM_F_CREATE | unix.NLM_F_APPEND
	}
	req, err := fdbRequest(unix.RTM_NEWNEIGH, mode, linkIndex, e)
	if err != nil {
		return err
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("add FDB entry %s: %w", e, err)
	}
	return nil
}

// delFDB removes e (only that destination of a zero-MAC entry). An entry already gone is no error.
func delFDB(linkIndex int, e fdbEntry) error {
	req, err := fdbRequest(unix.RTM_DELNEIGH, 0, linkIndex, e)
	if err != nil {
		return err
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !isGone(err) {
		return fmt.Errorf("delete FDB entry %s: %w", e, err)
	}
	return nil
}

func isGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV)
}
