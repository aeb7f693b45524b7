//go:build linux

package bpf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// DestroySockets aborts the open TCP connections and connected UDP sockets that the hooks
// translated to one of gone (Gone gives them after a Sync), in every network namespace of
// the processes below CgroupPath, and returns how many it aborted. Their clients see
// ECONNABORTED at once instead of talking to a backend that has left. A socket someone opened
// to the backend's address directly, without the VIP, is left alone. SCTP endpoints are
// skipped: the kernel can destroy TCP and UDP sockets only.
func (lb *LB) DestroySockets(ctx context.Context, gone []Endpoint) (int, error) {
	eps, err := normalizeEndpoints(gone)
	if err != nil {
		return 0, fmt.Errorf("destroy sockets: %w", err)
	}
	targets := map[Endpoint]bool{}
	for _, e := range eps {
		if e.Proto == SCTP {
			lb.log.Debug("not destroying SCTP sockets: the kernel cannot", "endpoint", e.String())
			continue
		}
		targets[e] = true
	}
	if len(targets) == 0 {
		return 0, nil
	}

	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return 0, errors.New("destroy sockets: load balancer is closed")
	}
	if lb.destroy == nil {
		d, err := newDestroyer(lb)
		if err != nil {
			return 0, fmt.Errorf("destroy sockets: %w", err)
		}
		lb.destroy = d
	}
	namespaces, err := cgroupNetns(lb.opts.CgroupPath)
	if err != nil {
		return 0, fmt.Errorf("destroy sockets: %w", err)
	}
	defer closeAll(namespaces)

	total := 0
	var errs []error
	for _, chunk := range chunks(targets, maxTargets) {
		n, err := lb.destroyIn(ctx, namespaces, chunk)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if total > 0 {
		lb.log.Info("destroyed sockets of removed backends", "sockets", total, "namespaces", len(namespaces), "method", string(lb.destroy.method))
	}
	if err := errors.Join(errs...); err != nil {
		return total, fmt.Errorf("destroy sockets (%s): %w", lb.destroy.method, err)
	}
	return total, nil
}

// maxTargets is the size of the iterators' target map (c/lb_destroy.c): larger sets of gone
// endpoints are destroyed a part at a time.
const maxTargets = 4096

func chunks(targets map[Endpoint]bool, size int) []map[Endpoint]bool {
	var out []map[Endpoint]bool
	for e := range targets {
		if len(out) == 0 || len(out[len(out)-1]) == size {
			out = append(out, map[Endpoint]bool{})
		}
		out[len(out)-1][e] = true
	}
	return out
}

// destroyIn destroys the sockets to targets in each of namespaces.
func (lb *LB) destroyIn(ctx context.Context, namespaces []*os.File, targets map[Endpoint]bool) (int, error) {
	run, err := lb.destroy.prepare(targets)
	if err != nil {
		return 0, err
	}
	defer lb.destroy.finish(targets)
	total := 0
	var errs []error
	for _, ns := range namespaces {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		err := inNetns(ns, func() error {
			n, err := run()
			total += n
			return err
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// destroyer is one of the two ways to destroy sockets.
type destroyer struct {
	method DestroyMethod
	lb     *LB

	// iterator only
	objs     lbDestroyObjects
	tcp, udp *link.Iter
}

// newDestroyer sets up the method of Options.DestroyMethod (checked by Open).
func newDestroyer(lb *LB) (*destroyer, error) {
	if lb.opts.DestroyMethod == DestroySockDiag {
		return &destroyer{method: DestroySockDiag, lb: lb}, nil
	}
	d, err := newIterDestroyer(lb)
	if err == nil {
		return d, nil
	}
	if lb.opts.DestroyMethod == DestroyIterator || !errors.Is(err, ebpf.ErrNotSupported) {
		return nil, err
	}
	lb.log.Info("socket iterators with bpf_sock_destroy are not available, using sock_diag", "error", err)
	return &destroyer{method: DestroySockDiag, lb: lb}, nil
}

func newIterDestroyer(lb *LB) (*destroyer, error) {
	d := &destroyer{method: DestroyIterator, lb: lb}
	// The iterators share the hooks' maps; they pin nothing and are attached for this process
	// only (an iterator link has no target to stay attached to).
	spec, err := loadLbDestroy()
	if err != nil {
		return nil, fmt.Errorf("load socket destroy iterators: %w", err)
	}
	shared := map[string]*ebpf.Map{
		"cm_lb_svc":     lb.objs.CmLbSvc,
		"cm_lb_backend": lb.objs.CmLbBackend,
		"cm_lb_revnat":  lb.objs.CmLbRevnat,
	}
	// The hooks' maps may be sized otherwise than compiled (Options.ServiceMapEntries): a
	// replacement must match its spec.
	for name, m := range shared {
		if ms, ok := spec.Maps[name]; ok {
			ms.MaxEntries = m.MaxEntries()
		}
	}
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{MapReplacements: shared})
	if err != nil {
		return nil, fmt.Errorf("load socket destroy iterators: %w", err)
	}
	if d.tcp, err = link.AttachIter(link.IterOptions{Program: d.objs.CmDestroyTcp}); err != nil {
		d.close()
		return nil, fmt.Errorf("attach TCP socket iterator: %w", err)
	}
	if d.udp, err = link.AttachIter(link.IterOptions{Program: d.objs.CmDestroyUdp}); err != nil {
		d.close()
		return nil, fmt.Errorf("attach UDP socket iterator: %w", err)
	}
	return d, nil
}

func (d *destroyer) close() error {
	var errs []error
	for _, it := range []*link.Iter{d.tcp, d.udp} {
		if it != nil {
			errs = append(errs, it.Close())
		}
	}
	if d.method == DestroyIterator {
		errs = append(errs, d.objs.Close())
	}
	return errors.Join(errs...)
}

func targetKey(e Endpoint) lbDestroyLbTarget {
	var k lbDestroyLbTarget
	k.Addr.B = addrBytes(e.Addr)
	k.Port = netPort(e.Port)
	k.Proto = uint8(e.Proto)
	return k
}

// prepare readies a run over targets and returns what destroys the matching sockets of the
// calling thread's network namespace.
func (d *destroyer) prepare(targets map[Endpoint]bool) (func() (int, error), error) {
	var tcp, udp bool
	for e := range targets {
		tcp = tcp || e.Proto == TCP
		udp = udp || e.Proto == UDP
	}
	if d.method == DestroySockDiag {
		return func() (int, error) { return sockDiagDestroy(targets, d.lb.objs.CmLbRevnat, tcp, udp) }, nil
	}
	for e := range targets {
		if err := d.objs.CmLbTargets.Put(targetKey(e), uint8(1)); err != nil {
			return nil, fmt.Errorf("map %s: put %s: %w", mapName(d.objs.CmLbTargets), e, err)
		}
	}
	return func() (int, error) {
		n := 0
		for _, it := range []struct {
			on   bool
			iter *link.Iter
			name string
		}{{tcp, d.tcp, "TCP"}, {udp, d.udp, "UDP"}} {
			if !it.on {
				continue
			}
			// Opening the iterator binds it to this thread's network namespace.
			rd, err := it.iter.Open()
			if err != nil {
				return n, fmt.Errorf("open %s socket iterator: %w", it.name, err)
			}
			out, err := io.ReadAll(rd)
			rd.Close()
			n += len(out) / 8 // one socket cookie per destroyed socket
			if err != nil {
				return n, fmt.Errorf("run %s socket iterator: %w", it.name, err)
			}
		}
		return n, nil
	}, nil
}

// finish empties the iterators' target map again.
func (d *destroyer) finish(targets map[Endpoint]bool) {
	if d.method != DestroyIterator {
		return
	}
	for e := range targets {
		_ = d.objs.CmLbTargets.Delete(targetKey(e))
	}
}
