//go:build linux

package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Reading and writing the service and backend maps: the I/O around plan.go.

func encodeSlotKey(k slotKey) lbSockLbSvcKey {
	var out lbSockLbSvcKey
	out.Addr.B = addrBytes(k.svc.vip)
	out.Port = netPort(k.svc.port)
	out.Proto = uint8(k.svc.proto)
	out.Slot = k.slot
	return out
}

func decodeSlotKey(k lbSockLbSvcKey) slotKey {
	return slotKey{
		svc:  svcKey{vip: addrFromBytes(k.Addr.B), port: hostPort(k.Port), proto: Proto(k.Proto)},
		slot: k.Slot,
	}
}

func encodeBackend(b backendVal) lbSockLbBackend {
	var out lbSockLbBackend
	out.Addr.B = addrBytes(b.addr)
	out.Port = netPort(b.port)
	out.ClusterId = b.cluster
	out.SvcId = b.svcID
	return out
}

func decodeBackend(b lbSockLbBackend) backendVal {
	return backendVal{addr: addrFromBytes(b.Addr.B), port: hostPort(b.Port), cluster: b.ClusterId, svcID: b.SvcId}
}

// readTables reads both maps whole.
func readTables(svc, backends *ebpf.Map) (tables, error) {
	t := newTables()
	err := dump(svc, func(k lbSockLbSvcKey, v lbSockLbSvcVal) {
		t.svc[decodeSlotKey(k)] = slotVal{id: v.Id, count: v.Count}
	})
	if err != nil {
		return tables{}, fmt.Errorf("read map %s: %w", mapName(svc), err)
	}
	err = dump(backends, func(id uint32, b lbSockLbBackend) { t.backends[id] = decodeBackend(b) })
	if err != nil {
		return tables{}, fmt.Errorf("read map %s: %w", mapName(backends), err)
	}
	return t, nil
}

// dumpBatch is how many entries dump reads per system call.
const dumpBatch = 4096

// dump calls each for every entry of the hash map m: in batches where the kernel has batch
// lookups (5.6+), which makes Sync's read of tens of thousands of entries a few system calls
// instead of two per entry; one by one elsewhere.
func dump[K, V any](m *ebpf.Map, each func(K, V)) error {
	keys, vals := make([]K, dumpBatch), make([]V, dumpBatch)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			each(keys[i], vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil // the end
		case first && n == 0 && errors.Is(err, ebpf.ErrNotSupported):
			var (
				k K
				v V
			)
			it := m.Iterate()
			for it.Next(&k, &v) {
				each(k, v)
			}
			return it.Err()
		case err != nil:
			return err
		}
	}
}

// applyOps writes ops in order, calling wrote after each write. A delete of an entry that is
// already gone is no error (the plan came from a read the kernel may have raced with nothing
// else, but a retry after a partial failure must converge).
func applyOps(svc, backends *ebpf.Map, ops []op, wrote func()) error {
	for _, o := range ops {
		var err error
		var m *ebpf.Map
		switch o.kind {
		case opPutBackend:
			m = backends
			err = backends.Put(o.id, encodeBackend(o.backend))
		case opPutSlot:
			m = svc
			err = svc.Put(encodeSlotKey(o.slot), lbSockLbSvcVal{Id: o.slotVal.id, Count: o.slotVal.count})
		case opDeleteSlot:
			m = svc
			err = svc.Delete(encodeSlotKey(o.slot))
		case opDeleteBackend:
			m = backends
			err = backends.Delete(o.id)
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("map %s: %s: %w", mapName(m), o, err)
		}
		wrote()
	}
	return nil
}

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil {
		return info.Name
	}
	return m.String()
}
