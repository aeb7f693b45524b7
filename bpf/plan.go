package bpf

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// This file is the pure core of Sync: the contents of the two maps as Go values, the contents
// they should have for a set of services, and the ordered writes that get from one to the
// other. No I/O: maps.go reads and writes the kernel's maps.
//
// The layout is Cilium's: the service map holds, per VIP, port and protocol, slot 0 with the
// service's id and backend count, and slots 1..count with backend ids; the backend map holds
// the backends by id. A backend id belongs to one service (see lb.h for why).

type svcKey struct {
	vip   netip.Addr
	port  uint16
	proto Proto
}

func (k svcKey) String() string {
	return netip.AddrPortFrom(k.vip, k.port).String() + "/" + k.proto.String()
}

func (k svcKey) compare(o svcKey) int {
	return cmp.Or(k.vip.Compare(o.vip), cmp.Compare(k.port, o.port), cmp.Compare(k.proto, o.proto))
}

type slotKey struct {
	svc  svcKey
	slot uint16
}

type slotVal struct {
	id    uint32 // slot 0: the service's id; slot n: a backend id
	count uint16 // slot 0 only
}

type backendVal struct {
	addr    netip.Addr
	port    uint16
	cluster uint32
	svcID   uint32
}

// tables is the content of the service map and the backend map.
type tables struct {
	svc      map[slotKey]slotVal
	backends map[uint32]backendVal
}

func newTables() tables {
	return tables{svc: map[slotKey]slotVal{}, backends: map[uint32]backendVal{}}
}

// slotBackend is the backend id in slot n of the service k with id sid, if the slot is there
// and refers to a backend of that service; a write cut short by a crash can leave others.
func (t tables) slotBackend(k svcKey, sid uint32, n uint16) (uint32, backendVal, bool) {
	v, ok := t.svc[slotKey{k, n}]
	if !ok {
		return 0, backendVal{}, false
	}
	b, ok := t.backends[v.id]
	if !ok || b.svcID != sid {
		return 0, backendVal{}, false
	}
	return v.id, b, true
}

// services reads the services back from the tables, in key order, backends in slot order.
// A slot that does not lead to a backend of its service is left out.
func (t tables) services() []Service {
	out := []Service{}
	for k, v := range t.svc {
		if k.slot != 0 {
			continue
		}
		s := Service{VIP: k.svc.vip, Port: k.svc.port, Proto: k.svc.proto, Backends: []Backend{}}
		for n := uint16(1); n <= v.count && n != 0; n++ {
			if _, b, ok := t.slotBackend(k.svc, v.id, n); ok {
				s.Backends = append(s.Backends, Backend{Addr: b.addr, Port: b.port, ClusterID: b.cluster})
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Service) int { return a.key().compare(b.key()) })
	return out
}

// allocator hands out the smallest ids that are neither in use nor handed out already.
type allocator struct {
	used map[uint32]bool
	next uint32
}

func (a *allocator) take() uint32 {
	for a.next++; a.used[a.next]; a.next++ {
	}
	a.used[a.next] = true
	return a.next
}

// desiredTables is what the maps should hold for services (normalized), keeping every id,
// slot and backend of cur that can stay: a backend that stays keeps its id, and its slot
// unless the service shrank below it; new backends fill the freed slots.
func desiredTables(cur tables, services []Service) tables {
	svcIDs := &allocator{used: map[uint32]bool{}}
	beIDs := &allocator{used: map[uint32]bool{}}
	for k, v := range cur.svc {
		if k.slot == 0 {
			svcIDs.used[v.id] = true
		} else {
			beIDs.used[v.id] = true
		}
	}
	for id := range cur.backends {
		beIDs.used[id] = true
	}

	sorted := slices.Clone(services)
	slices.SortFunc(sorted, func(a, b Service) int { return a.key().compare(b.key()) })

	want := newTables()
	for _, s := range sorted {
		k := s.key()
		head, exists := cur.svc[slotKey{k, 0}]
		sid := head.id
		if !exists || sid == 0 {
			sid = svcIDs.take()
		}

		// The backends this service has now, by address and port: their id and slot.
		type place struct {
			id   uint32
			slot uint16
		}
		have := map[netip.AddrPort]place{}
		if exists {
			for n := uint16(1); n <= head.count && n != 0; n++ {
				if id, b, ok := cur.slotBackend(k, sid, n); ok {
					ap := netip.AddrPortFrom(b.addr, b.port)
					if _, dup := have[ap]; !dup {
						have[ap] = place{id, n}
					}
				}
			}
		}

		count := len(s.Backends)
		slots := make([]uint32, count+1) // slots[n] is slot n; slots[0] unused
		var moving []Backend
		for _, b := range s.Backends {
			p, ok := have[netip.AddrPortFrom(b.Addr, b.Port)]
			if ok && int(p.slot) <= count && slots[p.slot] == 0 {
				slots[p.slot] = p.id
			} else {
				moving = append(moving, b)
			}
			if ok {
				want.backends[p.id] = backendVal{addr: b.Addr, port: b.Port, cluster: b.ClusterID, svcID: sid}
			}
		}
		n := 1
		for _, b := range moving {
			for slots[n] != 0 {
				n++
			}
			if p, ok := have[netip.AddrPortFrom(b.Addr, b.Port)]; ok {
				slots[n] = p.id // moves to a lower slot, keeping its id
				continue
			}
			id := beIDs.take()
			want.backends[id] = backendVal{addr: b.Addr, port: b.Port, cluster: b.ClusterID, svcID: sid}
			slots[n] = id
		}

		want.svc[slotKey{k, 0}] = slotVal{id: sid, count: uint16(count)}
		for n := 1; n <= count; n++ {
			want.svc[slotKey{k, uint16(n)}] = slotVal{id: slots[n]}
		}
	}
	return want
}

type opKind uint8

const (
	opPutBackend opKind = iota
	opPutSlot
	opDeleteSlot
	opDeleteBackend
)

// op is one write to a map.
type op struct {
	kind    opKind
	slot    slotKey
	slotVal slotVal
	id      uint32
	backend backendVal
}

func (o op) String() string {
	switch o.kind {
	case opPutBackend:
		return fmt.Sprintf("put backend %d %s", o.id, netip.AddrPortFrom(o.backend.addr, o.backend.port))
	case opPutSlot:
		return fmt.Sprintf("put %s slot %d = %d/%d", o.slot.svc, o.slot.slot, o.slotVal.id, o.slotVal.count)
	case opDeleteSlot:
		return fmt.Sprintf("delete %s slot %d", o.slot.svc, o.slot.slot)
	default:
		return fmt.Sprintf("delete backend %d", o.id)
	}
}

// diff returns the writes from cur to want, in an order that never leaves a service with
// backends looking empty or pointing at a missing backend: backends are written before the
// slots that name them, slots before the count that exposes them; a service shrinks by its
// count first, and loses slots and backends after. A service that goes loses its slot 0
// first, so that connects stop being translated before its backends disappear; it goes before
// anything is added, so that the room it frees in full maps is there for what is added.
func diff(cur, want tables) []op {
	var putBackends, putSlots, putHeads, delHeads, delSlots, delBackends []op
	var goneHeads, goneSlots, goneBackends []op // of services that go altogether
	wantKeys, wantIDs := map[svcKey]bool{}, map[uint32]bool{}
	for k, v := range want.svc {
		if k.slot == 0 {
			wantKeys[k.svc], wantIDs[v.id] = true, true
		}
	}
	for id, b := range want.backends {
		if old, ok := cur.backends[id]; !ok || old != b {
			putBackends = append(putBackends, op{kind: opPutBackend, id: id, backend: b})
		}
	}
	for k, v := range want.svc {
		if old, ok := cur.svc[k]; ok && old == v {
			continue
		}
		o := op{kind: opPutSlot, slot: k, slotVal: v}
		if k.slot == 0 {
			putHeads = append(putHeads, o)
		} else {
			putSlots = append(putSlots, o)
		}
	}
	for k := range cur.svc {
		if _, ok := want.svc[k]; ok {
			continue
		}
		o := op{kind: opDeleteSlot, slot: k}
		switch {
		case !wantKeys[k.svc] && k.slot == 0:
			goneHeads = append(goneHeads, o)
		case !wantKeys[k.svc]:
			goneSlots = append(goneSlots, o)
		case k.slot == 0:
			delHeads = append(delHeads, o)
		default:
			delSlots = append(delSlots, o)
		}
	}
	for id, b := range cur.backends {
		if _, ok := want.backends[id]; ok {
			continue
		}
		// No wanted slot names a backend of another service (desiredTables keeps an id only
		// within its service), so one of a service that goes, or of none, can go first.
		if o := (op{kind: opDeleteBackend, id: id}); wantIDs[b.svcID] {
			delBackends = append(delBackends, o)
		} else {
			goneBackends = append(goneBackends, o)
		}
	}
	byID := func(a, b op) int { return cmp.Compare(a.id, b.id) }
	bySlot := func(a, b op) int {
		return cmp.Or(a.slot.svc.compare(b.slot.svc), cmp.Compare(a.slot.slot, b.slot.slot))
	}
	slices.SortFunc(putBackends, byID)
	slices.SortFunc(putSlots, bySlot)
	slices.SortFunc(putHeads, bySlot)
	slices.SortFunc(delHeads, bySlot)
	slices.SortFunc(delSlots, bySlot)
	slices.SortFunc(delBackends, byID)
	slices.SortFunc(goneHeads, bySlot)
	slices.SortFunc(goneSlots, bySlot)
	slices.SortFunc(goneBackends, byID)
	return slices.Concat(goneHeads, goneSlots, goneBackends, putBackends, putSlots, putHeads, delHeads, delSlots, delBackends)
}

// capacity is how many entries each map holds.
type capacity struct{ svc, backends int }

// planSync checks services and returns the writes that make cur hold exactly them. It refuses,
// before any write, input that is invalid or would not fit in the maps while the writes are
// under way (new entries are written before old ones go).
func planSync(cur tables, services []Service, capa capacity) ([]op, error) {
	norm, err := normalizeServices(services)
	if err != nil {
		return nil, err
	}
	want := desiredTables(cur, norm)
	ops := diff(cur, want)
	peakSvc, peakBackends := peakEntries(cur, ops)
	if peakSvc > capa.svc {
		return nil, fmt.Errorf("%w: %d services with their backend slots need %d service map entries while updating, the map holds %d", errNoRoom, len(norm), peakSvc, capa.svc)
	}
	if peakBackends > capa.backends {
		return nil, fmt.Errorf("%w: the backends need %d backend map entries while updating, the map holds %d", errNoRoom, peakBackends, capa.backends)
	}
	return ops, nil
}

// peakEntries is the most entries the service map and the backend map hold while ops are
// written in order from cur.
func peakEntries(cur tables, ops []op) (svc, backends int) {
	nSvc, nBackends := len(cur.svc), len(cur.backends)
	svc, backends = nSvc, nBackends
	svcLive := make(map[slotKey]bool, len(cur.svc))
	for k := range cur.svc {
		svcLive[k] = true
	}
	beLive := make(map[uint32]bool, len(cur.backends))
	for id := range cur.backends {
		beLive[id] = true
	}
	for _, o := range ops {
		switch o.kind {
		case opPutSlot:
			if !svcLive[o.slot] {
				svcLive[o.slot] = true
				nSvc++
			}
		case opDeleteSlot:
			if svcLive[o.slot] {
				delete(svcLive, o.slot)
				nSvc--
			}
		case opPutBackend:
			if !beLive[o.id] {
				beLive[o.id] = true
				nBackends++
			}
		case opDeleteBackend:
			if beLive[o.id] {
				delete(beLive, o.id)
				nBackends--
			}
		}
		svc, backends = max(svc, nSvc), max(backends, nBackends)
	}
	return svc, backends
}

// Gone returns the backends of before that are a backend of no service in after, with the
// protocol of their service: the endpoints whose translated sockets DestroySockets should
// abort after Sync(after). A backend that only moved to another service of the same protocol
// stays, since its connections still reach a wanted backend.
func Gone(before, after []Service) []Endpoint {
	keep := map[Endpoint]bool{}
	for _, s := range after {
		for _, b := range s.Backends {
			keep[Endpoint{Addr: b.Addr.Unmap(), Port: b.Port, Proto: s.Proto}] = true
		}
	}
	seen := map[Endpoint]bool{}
	var out []Endpoint
	for _, s := range before {
		for _, b := range s.Backends {
			e := Endpoint{Addr: b.Addr.Unmap(), Port: b.Port, Proto: s.Proto}
			if !keep[e] && !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
	}
	return out
}
