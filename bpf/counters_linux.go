//go:build linux

package bpf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
)

// Counters counts the traffic of each remote cluster on the cable interfaces: tcx programs
// on ingress and egress add every IP packet whose remote address (source on ingress,
// destination on egress) falls in a subnet of that cluster. The agent sets the subnets with
// SetSubnets. Maps and links are pinned under Options.PinDir like the load balancer's.
type Counters struct {
	opts Options
	log  *slog.Logger
	maps countersMaps

	mu     sync.Mutex
	progs  map[uint32]*countersPrograms // by l3_offset: one build per kind of device
	links  map[string]link.Link         // by pin name
	closed bool
}

const ctrLinkPrefix = "ctr_"
const ctrMapPrefix = "cm_ctr_"

// maxClusterID is the largest cluster ID the counters hold (the broker assigns 1..255).
const maxClusterID = 255

// OpenCounters loads the counter maps, or adopts those pinned in opts.PinDir (keeping their
// counts). CgroupPath is not used.
func OpenCounters(ctx context.Context, opts Options) (*Counters, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := preparePinDir(opts.PinDir); err != nil {
		return nil, fmt.Errorf("open counters: %w", err)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("open counters: %w", err)
	}
	c := &Counters{opts: opts, log: opts.logger(), progs: map[uint32]*countersPrograms{}, links: map[string]link.Link{}}
	spec, err := loadCounters()
	if err != nil {
		return nil, fmt.Errorf("open counters: %w", err)
	}
	if err := spec.LoadAndAssign(&c.maps, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.PinDir}}); err != nil {
		return nil, fmt.Errorf("open counters: load maps: %w", err)
	}
	// An agent that stopped between changing the subnets and bumping the generation would leave
	// the programs' caches trusting the old subnets: start from a new generation.
	if err := c.bumpGeneration(); err != nil {
		c.maps.Close()
		return nil, fmt.Errorf("open counters: %w", err)
	}
	return c, nil
}

// AttachCounters opens the counters and attaches them to ifname: the short form for one
// cable interface.
func AttachCounters(ctx context.Context, opts Options, ifname string) (*Counters, error) {
	c, err := OpenCounters(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := c.Attach(ifname); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// programs returns the programs built for devices whose IP header starts at offset.
func (c *Counters) programs(offset uint32) (*countersPrograms, error) {
	if p := c.progs[offset]; p != nil {
		return p, nil
	}
	spec, err := loadCounters()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["l3_offset"].Set(offset); err != nil {
		return nil, fmt.Errorf("set l3_offset: %w", err)
	}
	p := &countersPrograms{}
	err = spec.LoadAndAssign(p, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		"cm_ctr_subnet": c.maps.CmCtrSubnet,
		"cm_ctr_stats":  c.maps.CmCtrStats,
		"cm_ctr_gen":    c.maps.CmCtrGen,
		"cm_ctr_cache":  c.maps.CmCtrCache,
	}})
	if err != nil {
		return nil, fmt.Errorf("load counter programs: %w", err)
	}
	c.progs[offset] = p
	return p, nil
}

// l3Offset is where the IP header starts in the packets tc sees on a device: after an
// Ethernet header, or at once on devices without a link layer (TUN, WireGuard).
func l3Offset(l netlink.Link) uint32 {
	switch l.Attrs().EncapType {
	case "ether", "loopback":
		return 14
	}
	return 0
}

// Attach attaches the counters to ingress and egress of ifname, which is looked up in the
// network namespace of the calling thread (tcx resolves the interface index there): call it
// from the agent running in the node's namespace, or from a locked thread that entered it.
// A link pinned by an earlier agent for the same interface is adopted.
func (c *Counters) Attach(ifname string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("attach counters: closed")
	}
	// The lookup and the attach must see the same namespace: keep to this thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("attach counters to %s: %w", ifname, err)
	}
	ifindex := l.Attrs().Index
	progs, err := c.programs(l3Offset(l))
	if err != nil {
		return fmt.Errorf("attach counters to %s: %w", ifname, err)
	}
	for _, h := range []struct {
		dir    string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{{"ingress", progs.CmCtrIngress, ebpf.AttachTCXIngress}, {"egress", progs.CmCtrEgress, ebpf.AttachTCXEgress}} {
		name := ctrLinkPrefix + ifname + "_" + h.dir
		pin := linkPin(c.opts.PinDir, name)
		if old := c.links[name]; old != nil {
			old.Close()
			delete(c.links, name)
		}
		lk, ok, err := adopt(c.log, pin, h.prog, func(info *link.Info) (bool, bool) {
			tcx := info.TCX()
			if tcx == nil {
				return false, false
			}
			// A recreated interface has a new index: the old link went with the old one.
			return ebpf.AttachType(tcx.AttachType) == h.attach && tcx.Ifindex == uint32(ifindex), tcx.Ifindex != uint32(ifindex)
		})
		if err != nil {
			return fmt.Errorf("attach counters to %s %s: %w", ifname, h.dir, err)
		}
		if !ok {
			if lk, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: h.prog, Attach: h.attach}); err != nil {
				return fmt.Errorf("attach counters to %s %s: %w", ifname, h.dir, err)
			}
			if err := pinLink(lk, pin); err != nil {
				return fmt.Errorf("attach counters to %s %s: %w", ifname, h.dir, err)
			}
			c.log.Info("attached counters", "interface", ifname, "direction", h.dir)
		}
		c.links[name] = lk
	}
	return nil
}

// Detach detaches the counters from ifname and removes their pins.
func (c *Counters) Detach(ifname string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, dir := range []string{"ingress", "egress"} {
		name := ctrLinkPrefix + ifname + "_" + dir
		if l := c.links[name]; l != nil {
			l.Close()
			delete(c.links, name)
		}
		errs = append(errs, detachPinned(linkPin(c.opts.PinDir, name)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach counters from %s: %w", ifname, err)
	}
	return nil
}

// Attachments lists the attached counter programs.
func (c *Counters) Attachments() ([]Attachment, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Attachment
	for name, l := range c.links {
		info, err := l.Info()
		if err != nil {
			return nil, fmt.Errorf("list counter attachments: %s: %w", name, err)
		}
		out = append(out, Attachment{Hook: name, Pin: linkPin(c.opts.PinDir, name), LinkID: uint32(info.ID), ProgramID: uint32(info.Program)})
	}
	return out, nil
}

// Close releases this process's file descriptors; the counters stay attached and keep
// counting, and the next OpenCounters and Attach adopt them.
func (c *Counters) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeLocked()
}

func (c *Counters) closeLocked() error {
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, l := range c.links {
		errs = append(errs, l.Close())
	}
	for _, p := range c.progs {
		errs = append(errs, p.Close())
	}
	errs = append(errs, c.maps.Close())
	return errors.Join(errs...)
}

// Remove detaches the counters from every interface, unpins their maps and links, and
// deletes PinDir when nothing else is pinned there.
func (c *Counters) Remove() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	errs := []error{c.closeLocked(), removePins(c.opts.PinDir, ctrMapPrefix, ctrLinkPrefix)}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove counters: %w", err)
	}
	return nil
}
