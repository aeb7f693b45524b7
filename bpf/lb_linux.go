//go:build linux

package bpf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// LB is the socket load balancer: the cgroup hooks and their service maps, pinned under
// Options.PinDir. Its methods are safe for concurrent use.
type LB struct {
	opts  Options
	log   *slog.Logger
	objs  lbSockObjects
	links map[string]link.Link // by hook name, e.g. "connect4"

	mu      sync.Mutex // serializes Sync, Services and DestroySockets
	writes  atomic.Uint64
	destroy *destroyer // nil until the first DestroySockets
	closed  bool
}

// hooks are the cgroup hooks, by the name their link is pinned under.
func (o *lbSockObjects) hooks() []struct {
	name   string
	prog   *ebpf.Program
	attach ebpf.AttachType
} {
	return []struct {
		name   string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{"connect4", o.CmConnect4, ebpf.AttachCGroupInet4Connect},
		{"sendmsg4", o.CmSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"recvmsg4", o.CmRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"getpeername4", o.CmGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"connect6", o.CmConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg6", o.CmSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg6", o.CmRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername6", o.CmGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	}
}

const lbLinkPrefix = "lb_"
const lbMapPrefix = "cm_lb_"

// Open loads the load balancer, or adopts what a previous agent pinned in opts.PinDir: its
// maps (with their services and the state of open sockets) and its links, whose programs it
// replaces in place when they differ from this build's. Nothing is ever detached by Open.
func Open(ctx context.Context, opts Options) (*LB, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	log := opts.logger()
	switch opts.DestroyMethod {
	case DestroyAuto, DestroyIterator, DestroySockDiag:
	default:
		return nil, fmt.Errorf("open load balancer: DestroyMethod %q: want %q, %q or empty", opts.DestroyMethod, DestroyIterator, DestroySockDiag)
	}
	if err := preparePinDir(opts.PinDir); err != nil {
		return nil, fmt.Errorf("open load balancer: %w", err)
	}
	cgID, err := cgroupID(opts.CgroupPath)
	if err != nil {
		return nil, fmt.Errorf("open load balancer: %w", err)
	}
	// Only kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; elsewhere this is a no-op.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("open load balancer: %w", err)
	}

	lb := &LB{opts: opts, log: log, links: map[string]link.Link{}}
	spec, err := loadLbSock()
	if err != nil {
		return nil, fmt.Errorf("open load balancer: load spec: %w", err)
	}
	if err := sizeServiceMaps(spec, opts, log); err != nil {
		return nil, fmt.Errorf("open load balancer: %w", err)
	}
	err = spec.LoadAndAssign(&lb.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.PinDir}})
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("open load balancer: maps pinned in %s are of another layout than this build's (remove them with bpf.Purge; open sockets lose their reverse translation): %w", opts.PinDir, err)
		}
		return nil, fmt.Errorf("open load balancer: load objects: %w", err)
	}

	for _, h := range lb.objs.hooks() {
		l, err := lb.attach(h.name, h.prog, h.attach, cgID)
		if err != nil {
			lb.Close()
			return nil, fmt.Errorf("open load balancer: hook %s: %w", h.name, err)
		}
		lb.links[h.name] = l
	}
	return lb, nil
}

func (lb *LB) attach(name string, prog *ebpf.Program, attach ebpf.AttachType, cgID uint64) (link.Link, error) {
	pin := linkPin(lb.opts.PinDir, lbLinkPrefix+name)
	l, ok, err := adopt(lb.log, pin, prog, func(info *link.Info) (bool, bool) {
		cg := info.Cgroup()
		if cg == nil {
			return false, false
		}
		if cg.CgroupId == 0 {
			return false, true // the cgroup it was attached to is gone
		}
		return cg.CgroupId == cgID && ebpf.AttachType(cg.AttachType) == attach, false
	})
	if err != nil || ok {
		return l, err
	}
	l, err = link.AttachCgroup(link.CgroupOptions{Path: lb.opts.CgroupPath, Attach: attach, Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach to cgroup %s: %w", lb.opts.CgroupPath, err)
	}
	if err := pinLink(l, pin); err != nil {
		return nil, err
	}
	lb.log.Info("attached socket hook", "hook", name, "cgroup", lb.opts.CgroupPath)
	return l, nil
}

// Sync makes the maps hold exactly services, with as few writes as it takes: a second Sync
// with the same services writes nothing. Backends and slots are written before the count that
// exposes them, and a service shrinks before its old backends go, so no connect ever finds a
// service with backends empty. Invalid input (a bad address, port 0, duplicates, more than
// MaxBackendsPerService backends) is refused before anything is written.
func (lb *LB) Sync(services []Service) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return errors.New("sync services: load balancer is closed")
	}
	cur, err := readTables(lb.objs.CmLbSvc, lb.objs.CmLbBackend)
	if err != nil {
		return fmt.Errorf("sync services: %w", err)
	}
	ops, err := planSync(cur, services, lb.capacity())
	if err != nil {
		return fmt.Errorf("sync services: %w", err)
	}
	if err := applyOps(lb.objs.CmLbSvc, lb.objs.CmLbBackend, ops, func() { lb.writes.Add(1) }); err != nil {
		return fmt.Errorf("sync services: %w", err)
	}
	if len(ops) > 0 {
		lb.log.Debug("synced services", "services", len(services), "writes", len(ops))
	}
	return nil
}

// SyncFit is Sync for maps that may be too small for every service: groups are the services
// in the order they have the maps, each group taken or refused as a whole (one service import's
// VIPs and ports). The groups that fit (fitGroups) are synced as Sync would; each other group is
// refused, and its services leave the maps. The error is for the maps themselves (they could
// not be read or written), never for what was wanted.
func (lb *LB) SyncFit(groups [][]Service) ([]Refusal, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, errors.New("sync services: load balancer is closed")
	}
	cur, err := readTables(lb.objs.CmLbSvc, lb.objs.CmLbBackend)
	if err != nil {
		return nil, fmt.Errorf("sync services: %w", err)
	}
	ops, refused, err := planFit(cur, groups, lb.capacity())
	if err != nil {
		return nil, fmt.Errorf("sync services: %w", err)
	}
	if err := applyOps(lb.objs.CmLbSvc, lb.objs.CmLbBackend, ops, func() { lb.writes.Add(1) }); err != nil {
		return nil, fmt.Errorf("sync services: %w", err)
	}
	if len(ops) > 0 {
		lb.log.Debug("synced services", "groups", len(groups), "refused", len(refused), "writes", len(ops))
	}
	return refused, nil
}

func (lb *LB) capacity() capacity {
	return capacity{svc: int(lb.objs.CmLbSvc.MaxEntries()), backends: int(lb.objs.CmLbBackend.MaxEntries())}
}

// Capacity is the number of entries the service map and the backend map hold.
func (lb *LB) Capacity() (svc, backends int) {
	c := lb.capacity()
	return c.svc, c.backends
}

// Services reads the services back from the maps: what the hooks translate right now.
func (lb *LB) Services() ([]Service, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, errors.New("read services: load balancer is closed")
	}
	t, err := readTables(lb.objs.CmLbSvc, lb.objs.CmLbBackend)
	if err != nil {
		return nil, fmt.Errorf("read services: %w", err)
	}
	return t.services(), nil
}

// Writes is the number of map writes (puts and deletes) Sync made since Open.
func (lb *LB) Writes() uint64 { return lb.writes.Load() }

// Attachment is one attached hook, for diagnostics.
type Attachment struct {
	Hook      string // e.g. "connect4", or "ingress"/"egress" for counters
	Pin       string
	LinkID    uint32
	ProgramID uint32
}

// Attachments lists the hooks with their link and program IDs.
func (lb *LB) Attachments() ([]Attachment, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, errors.New("list attachments: load balancer is closed")
	}
	var out []Attachment
	for _, h := range lb.objs.hooks() {
		info, err := lb.links[h.name].Info()
		if err != nil {
			return nil, fmt.Errorf("list attachments: hook %s: %w", h.name, err)
		}
		out = append(out, Attachment{Hook: h.name, Pin: linkPin(lb.opts.PinDir, lbLinkPrefix+h.name), LinkID: uint32(info.ID), ProgramID: uint32(info.Program)})
	}
	return out, nil
}

// Close releases this process's file descriptors. The pins stay, and with them the attached
// hooks and the maps: an agent restart neither detaches a hook nor breaks a connection.
func (lb *LB) Close() error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.closeLocked()
}

func (lb *LB) closeLocked() error {
	if lb.closed {
		return nil
	}
	lb.closed = true
	var errs []error
	for _, l := range lb.links {
		errs = append(errs, l.Close())
	}
	if lb.destroy != nil {
		errs = append(errs, lb.destroy.close())
	}
	errs = append(errs, lb.objs.Close())
	return errors.Join(errs...)
}

// Remove detaches the hooks, unpins the load balancer's maps and links, and deletes PinDir
// when nothing else (the counters) is pinned there: cleanup when the agent leaves for good.
func (lb *LB) Remove() error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	errs := []error{lb.closeLocked()}
	if err := removePins(lb.opts.PinDir, lbMapPrefix, lbLinkPrefix); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove load balancer: %w", err)
	}
	return nil
}
