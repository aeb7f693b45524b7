package bpf

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Fitting what is wanted into maps of a fixed size: when every wanted service does not fit,
// the caller's order decides which do, and each of the others is refused alone; nothing that
// fits is held back by what does not.

// Refusal is a group of services that SyncFit left out of the maps, and why.
type Refusal struct {
	Group  int // index into the groups given to SyncFit
	Reason string
}

// errNoRoom is wrapped by planSync's error when the maps are too small for the writes.
var errNoRoom = errors.New("the maps are too small")

// fitGroups chooses the groups of services that the maps take, in the order given: a group is
// taken when its services, with the groups taken before it, fit in capa while the writes from
// cur are under way; else it is refused, and the next group is tried. A group with an invalid
// service, or with a service (VIP, port, protocol) of a group taken before it, is refused too.
// It returns the services of the groups taken and the refusals, in group order. The result is
// checked by planSync: cost is exact for maps that a Sync wrote, an upper bound elsewhere is
// not guaranteed, so the caller drops groups from the end while planSync finds no room.
func fitGroups(cur tables, groups [][]Service, capa capacity) ([]Service, []Refusal) {
	c := newFitCost(cur)
	leftSvc, leftBackends := capa.svc, capa.backends
	var taken []Service
	var refused []Refusal
	owner := map[svcKey]int{}
	for g, group := range groups {
		norm, err := normalizeServices(group)
		if err != nil {
			refused = append(refused, Refusal{Group: g, Reason: err.Error()})
			continue
		}
		if s, other, dup := firstTaken(norm, owner); dup {
			refused = append(refused, Refusal{Group: g, Reason: fmt.Sprintf("%s is also a service of group %d", s, other)})
			continue
		}
		needSvc, needBackends := 0, 0
		for _, s := range norm {
			sv, be := c.of(s)
			needSvc, needBackends = needSvc+sv, needBackends+be
		}
		if needSvc > leftSvc || needBackends > leftBackends {
			refused = append(refused, Refusal{Group: g, Reason: fmt.Sprintf(
				"the load balancer's maps are full: it needs %d service map and %d backend map entries, %d and %d are left of %d and %d",
				needSvc, needBackends, max(leftSvc, 0), max(leftBackends, 0), capa.svc, capa.backends)})
			continue
		}
		leftSvc, leftBackends = leftSvc-needSvc, leftBackends-needBackends
		for _, s := range norm {
			owner[s.key()] = g
		}
		taken = append(taken, norm...)
	}
	return taken, refused
}

func firstTaken(services []Service, owner map[svcKey]int) (Service, int, bool) {
	for _, s := range services {
		if g, ok := owner[s.key()]; ok {
			return s, g, true
		}
	}
	return Service{}, 0, false
}

// fitCost is what cur holds, indexed for the cost of one service.
type fitCost struct {
	cur          tables
	slots        map[svcKey]map[uint16]bool
	backendsOfID map[uint32]int // backend entries by the id of their service
}

func newFitCost(cur tables) fitCost {
	c := fitCost{cur: cur, slots: map[svcKey]map[uint16]bool{}, backendsOfID: map[uint32]int{}}
	for k := range cur.svc {
		if c.slots[k.svc] == nil {
			c.slots[k.svc] = map[uint16]bool{}
		}
		c.slots[k.svc][k.slot] = true
	}
	for _, b := range cur.backends {
		c.backendsOfID[b.svcID]++
	}
	return c
}

// of is the most service map and backend map entries that service s (normalized) holds while
// a Sync that keeps it is under way (diff's order): entries of services that go are deleted
// first; s's slots now and wanted, its backends now and the new ones, are there together
// until the end.
func (c fitCost) of(s Service) (svc, backends int) {
	k := s.key()
	have := c.slots[k]
	svc = len(have)
	for n := 0; n <= len(s.Backends); n++ {
		if !have[uint16(n)] {
			svc++
		}
	}
	head, ok := c.cur.svc[slotKey{k, 0}]
	if !ok || head.id == 0 {
		return svc, len(s.Backends)
	}
	kept := map[netip.AddrPort]bool{}
	for n := uint16(1); n <= head.count && n != 0; n++ {
		if _, b, ok := c.cur.slotBackend(k, head.id, n); ok {
			kept[netip.AddrPortFrom(b.addr, b.port)] = true
		}
	}
	backends = c.backendsOfID[head.id]
	for _, b := range s.Backends {
		if !kept[netip.AddrPortFrom(b.Addr, b.Port)] {
			backends++
		}
	}
	return svc, backends
}

// planFit is fitGroups checked by planSync: the writes that make cur hold the groups taken,
// and the refusals. While planSync finds no room (an estimate below what the writes need, on
// maps that something else than Sync wrote), the last group taken is refused too.
func planFit(cur tables, groups [][]Service, capa capacity) ([]op, []Refusal, error) {
	_, refused := fitGroups(cur, groups, capa)
	out := map[int]bool{}
	for _, r := range refused {
		out[r.Group] = true
	}
	for {
		var services []Service
		last := -1
		for g, group := range groups {
			if !out[g] {
				services = append(services, group...)
				last = g
			}
		}
		ops, err := planSync(cur, services, capa)
		if err == nil || !errors.Is(err, errNoRoom) || last < 0 {
			return ops, sortRefusals(refused), err
		}
		out[last] = true
		refused = append(refused, Refusal{Group: last, Reason: "the load balancer's maps are full: " + err.Error()})
	}
}

func sortRefusals(r []Refusal) []Refusal {
	slices.SortStableFunc(r, func(a, b Refusal) int { return cmp.Compare(a.Group, b.Group) })
	return r
}
