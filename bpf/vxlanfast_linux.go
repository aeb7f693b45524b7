//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// VXLANFastPath is the vxlan cable's transmit shortcut (c/vxlan_encap.c): a tcx egress program on
// each VXLAN link that encapsulates the packets to known remote VTEPs itself and redirects them
// to the underlay link, instead of the kernel's VXLAN transmit. What it does not handle goes on to
// the VXLAN device as before, so attaching, detaching or a missing entry never drops traffic.
//
// Nothing is pinned: the links go with the process (Close, or its exit), and the kernel's VXLAN
// device then carries everything until the next agent attaches again.
type VXLANFastPath struct {
	mu      sync.Mutex
	objs    vxlanEncapObjects
	links   map[int]link.Link // by ifindex
	remotes map[int][]vxlanEncapVxfKey
	ttl     uint8
	ports   [2]uint16
	closed  bool
}

// VXLANRemote is one remote VTEP as a VXLAN link reaches it.
type VXLANRemote struct {
	// MAC is the remote device's MAC: the destination MAC of the inner frames to it.
	MAC net.HardwareAddr
	// Remote and Local are the outer destination and source (IPv4).
	Remote, Local netip.Addr
	VNI           uint32
	DstPort       uint16
	// Underlay is the index of the link the VXLAN device is bound to: the outer packets leave
	// through the route to Remote on it.
	Underlay int
}

// OpenVXLANFastPath loads the program and its maps. The outer TTL and the source port range are
// the kernel's for a VXLAN device made without ttl or srcport: this namespace's
// net.ipv4.ip_default_ttl and net.ipv4.ip_local_port_range, read now.
func OpenVXLANFastPath() (*VXLANFastPath, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("open vxlan fast path: %w", err)
	}
	ttl, err := readSysctlInts("net/ipv4/ip_default_ttl", 1)
	if err != nil {
		return nil, fmt.Errorf("open vxlan fast path: %w", err)
	}
	ports, err := readSysctlInts("net/ipv4/ip_local_port_range", 2)
	if err != nil {
		return nil, fmt.Errorf("open vxlan fast path: %w", err)
	}
	f := &VXLANFastPath{links: map[int]link.Link{}, remotes: map[int][]vxlanEncapVxfKey{},
		ttl: uint8(ttl[0]), ports: [2]uint16{uint16(ports[0]), uint16(ports[1])}}
	if err := loadVxlanEncapObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("open vxlan fast path: load: %w", err)
	}
	return f, nil
}

// readSysctlInts reads n whitespace-separated integers from /proc/sys/<path>.
func readSysctlInts(path string, n int) ([]int, error) {
	b, err := os.ReadFile("/proc/sys/" + path)
	if err != nil {
		return nil, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != n {
		return nil, fmt.Errorf("%s: %q: want %d numbers", path, strings.TrimSpace(string(b)), n)
	}
	out := make([]int, n)
	for i, s := range fields {
		if out[i], err = strconv.Atoi(s); err != nil || out[i] < 0 || out[i] > 65535 {
			return nil, fmt.Errorf("%s: %q is not a number from 0 to 65535", path, s)
		}
	}
	return out, nil
}

// Attach attaches the program to the egress of the VXLAN link ifindex (again if the link was
// recreated under the same index) and makes its counters. Attaching twice is a no-op.
func (f *VXLANFastPath) Attach(ifindex int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("vxlan fast path: closed")
	}
	if l := f.links[ifindex]; l != nil {
		if info, err := l.Info(); err == nil && info.TCX() != nil && info.TCX().Ifindex == uint32(ifindex) {
			return nil
		}
		l.Close()
		delete(f.links, ifindex)
	}
	key := uint32(ifindex)
	zero := make([]vxlanEncapVxfStats, ebpf.MustPossibleCPU())
	if err := f.objs.CmVxfStats.Update(key, zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("vxlan fast path: counters of link %d: %w", ifindex, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: f.objs.CmVxfEncap, Attach: ebpf.AttachTCXEgress})
	if err != nil {
		return fmt.Errorf("vxlan fast path: attach to link %d: %w", ifindex, err)
	}
	f.links[ifindex] = l
	return nil
}

// Detach takes the program off ifindex and forgets its remotes and counters.
func (f *VXLANFastPath) Detach(ifindex int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	if l := f.links[ifindex]; l != nil {
		errs = append(errs, l.Close())
		delete(f.links, ifindex)
	}
	errs = append(errs, f.setRemotes(ifindex, nil))
	if err := f.objs.CmVxfStats.Delete(uint32(ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vxlan fast path: detach from link %d: %w", ifindex, err)
	}
	return nil
}

// Attached lists the links the program is attached to.
func (f *VXLANFastPath) Attached() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]int, 0, len(f.links))
	for i := range f.links {
		out = append(out, i)
	}
	return out
}

// SetRemotes makes the remotes of link ifindex exactly rs. A remote is written before an old one
// is deleted, so a remote in both never misses.
func (f *VXLANFastPath) SetRemotes(ifindex int, rs []VXLANRemote) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("vxlan fast path: closed")
	}
	if err := f.setRemotes(ifindex, rs); err != nil {
		return fmt.Errorf("vxlan fast path: remotes of link %d: %w", ifindex, err)
	}
	return nil
}

func (f *VXLANFastPath) setRemotes(ifindex int, rs []VXLANRemote) error {
	keep := map[vxlanEncapVxfKey]bool{}
	var keys []vxlanEncapVxfKey
	for _, r := range rs {
		k, v, err := f.entry(ifindex, r)
		if err != nil {
			return err
		}
		if err := f.objs.CmVxfRemote.Put(k, v); err != nil {
			return fmt.Errorf("put remote %s (%s): %w", r.Remote, r.MAC, err)
		}
		keep[k] = true
		keys = append(keys, k)
	}
	var errs []error
	for _, k := range f.remotes[ifindex] {
		if keep[k] {
			continue
		}
		if err := f.objs.CmVxfRemote.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete remote %s: %w", net.HardwareAddr(k.Mac[:]), err))
		}
	}
	if len(keys) == 0 {
		delete(f.remotes, ifindex)
	} else {
		f.remotes[ifindex] = keys
	}
	return errors.Join(errs...)
}

func (f *VXLANFastPath) entry(ifindex int, r VXLANRemote) (vxlanEncapVxfKey, vxlanEncapVxfRemote, error) {
	var k vxlanEncapVxfKey
	if len(r.MAC) != 6 {
		return k, vxlanEncapVxfRemote{}, fmt.Errorf("remote %s: MAC %q is not 6 bytes", r.Remote, r.MAC)
	}
	remote, local := r.Remote.Unmap(), r.Local.Unmap()
	if !remote.Is4() || !local.Is4() {
		return k, vxlanEncapVxfRemote{}, fmt.Errorf("remote %s, local %s: both must be IPv4", r.Remote, r.Local)
	}
	if r.VNI > 1<<24-1 || r.DstPort == 0 || r.Underlay <= 0 {
		return k, vxlanEncapVxfRemote{}, fmt.Errorf("remote %s: VNI %d, port %d, underlay link %d: want a 24-bit VNI, a port and a link", r.Remote, r.VNI, r.DstPort, r.Underlay)
	}
	k.Ifindex = uint32(ifindex)
	copy(k.Mac[:], r.MAC)
	return k, vxlanEncapVxfRemote{
		Remote:   be32(remote),
		Local:    be32(local),
		Vni:      htonl(r.VNI << 8),
		Dport:    htons(r.DstPort),
		SportMin: f.ports[0],
		SportMax: f.ports[1],
		Ttl:      f.ttl,
		Oif:      uint32(r.Underlay),
	}, nil
}

// be32 is a's four bytes as the program reads them: in network order, loaded little-endian.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func htonl(v uint32) uint32 { return v>>24 | v>>8&0xff00 | v<<8&0xff0000 | v<<24 }
func htons(v uint16) uint16 { return v>>8 | v<<8 }

// TxCounts returns the packets and bytes (of the inner IP packets, as the kernel counts them) link ifindex sent through the
// shortcut: the kernel leaves them out of the link's own counters.
func (f *VXLANFastPath) TxCounts(ifindex int) (packets, bytes uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var per []vxlanEncapVxfStats
	if err := f.objs.CmVxfStats.Lookup(uint32(ifindex), &per); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, 0, nil
		}
		return 0, 0, fmt.Errorf("vxlan fast path: counters of link %d: %w", ifindex, err)
	}
	for _, s := range per {
		packets += s.Packets
		bytes += s.Bytes
	}
	return packets, bytes, nil
}

// Close detaches the program from every link; the VXLAN devices send everything again.
func (f *VXLANFastPath) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	var errs []error
	for _, l := range f.links {
		errs = append(errs, l.Close())
	}
	f.links = nil
	errs = append(errs, f.objs.Close())
	return errors.Join(errs...)
}
