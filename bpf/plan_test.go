package bpf

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var bigCapacity = capacity{svc: 1 << 20, backends: 1 << 20}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func be(addr string, port uint16, cluster uint32) Backend {
	return Backend{Addr: ip(addr), Port: port, ClusterID: cluster}
}

func svc(vip string, port uint16, proto Proto, backends ...Backend) Service {
	return Service{VIP: ip(vip), Port: port, Proto: proto, Backends: append([]Backend{}, backends...)}
}

// apply does to t what applyOps does to the kernel's maps.
func (t tables) apply(o op) {
	switch o.kind {
	case opPutBackend:
		t.backends[o.id] = o.backend
	case opPutSlot:
		t.svc[o.slot] = o.slotVal
	case opDeleteSlot:
		delete(t.svc, o.slot)
	case opDeleteBackend:
		delete(t.backends, o.id)
	}
}

func (t tables) clone() tables {
	c := newTables()
	for k, v := range t.svc {
		c.svc[k] = v
	}
	for k, v := range t.backends {
		c.backends[k] = v
	}
	return c
}

// synced returns the tables after a Sync of services onto t, and the writes it took.
func synced(t *testing.T, cur tables, services ...Service) (tables, []op) {
	t.Helper()
	ops, err := planSync(cur, services, bigCapacity)
	if err != nil {
		t.Fatalf("planSync: %v", err)
	}
	next := cur.clone()
	for _, o := range ops {
		next.apply(o)
	}
	return next, ops
}

func opStrings(ops []op) []string {
	var out []string
	for _, o := range ops {
		out = append(out, o.String())
	}
	return out
}

// consistent checks what a hook can observe at any moment: every service entry's slots lead to
// backends of that service.
func consistent(t tables) error {
	for k, v := range t.svc {
		if k.slot != 0 {
			continue
		}
		for n := uint16(1); n <= v.count; n++ {
			if _, _, ok := t.slotBackend(k.svc, v.id, n); !ok {
				return fmt.Errorf("%s slot %d of %d leads to no backend of the service", k.svc, n, v.count)
			}
		}
	}
	return nil
}

func TestSyncWritesInAnOrderThatNeverExposesAMissingBackend(t *testing.T) {
	web := func(backends ...Backend) Service { return svc("241.0.0.1", 80, TCP, backends...) }
	a, b, c, d := be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1), be("10.2.0.1", 8080, 2), be("10.2.0.2", 8080, 2)
	tests := []struct {
		name   string
		before []Service
		after  []Service
		want   []string
	}{
		{
			name:  "a new service writes its backends, then its slots, then its count",
			after: []Service{web(a, b)},
			want: []string{
				"put backend 1 10.1.0.1:8080", "put backend 2 10.1.0.2:8080",
				"put 241.0.0.1:80/tcp slot 1 = 1/0", "put 241.0.0.1:80/tcp slot 2 = 2/0",
				"put 241.0.0.1:80/tcp slot 0 = 1/2",
			},
		},
		{
			name:   "an added backend is written with its slot before the count grows",
			before: []Service{web(a)},
			after:  []Service{web(a, b)},
			want:   []string{"put backend 2 10.1.0.2:8080", "put 241.0.0.1:80/tcp slot 2 = 2/0", "put 241.0.0.1:80/tcp slot 0 = 1/2"},
		},
		{
			name:   "a removed backend's slot takes the last backend, the count shrinks, then the rest goes",
			before: []Service{web(a, b, c)},
			after:  []Service{web(b, c)},
			want: []string{
				"put 241.0.0.1:80/tcp slot 1 = 3/0", "put 241.0.0.1:80/tcp slot 0 = 1/2",
				"delete 241.0.0.1:80/tcp slot 3", "delete backend 1",
			},
		},
		{
			name:   "a replaced backend takes the slot of the one it replaces and the count stays",
			before: []Service{web(a, b)},
			after:  []Service{web(a, c)},
			want:   []string{"put backend 3 10.2.0.1:8080", "put 241.0.0.1:80/tcp slot 2 = 3/0", "delete backend 2"},
		},
		{
			name:   "a backend whose cluster changed is rewritten in place under its id",
			before: []Service{web(a, b)},
			after:  []Service{web(a, be("10.1.0.2", 8080, 7))},
			want:   []string{"put backend 2 10.1.0.2:8080"},
		},
		{
			name:   "backends given in another order change nothing",
			before: []Service{web(a, b, c)},
			after:  []Service{web(c, a, b)},
		},
		{
			name:   "a service whose backends all went stays with a count of zero",
			before: []Service{web(a, b)},
			after:  []Service{web()},
			want: []string{
				"put 241.0.0.1:80/tcp slot 0 = 1/0",
				"delete 241.0.0.1:80/tcp slot 1", "delete 241.0.0.1:80/tcp slot 2",
				"delete backend 1", "delete backend 2",
			},
		},
		{
			name:   "a service that goes loses its count before its slots and backends",
			before: []Service{web(a), svc("241.0.0.2", 53, UDP, d)},
			after:  []Service{web(a)},
			want:   []string{"delete 241.0.0.2:53/udp slot 0", "delete 241.0.0.2:53/udp slot 1", "delete backend 2"},
		},
		{
			name:   "the same VIP and port over another protocol is another service",
			before: []Service{web(a)},
			after:  []Service{web(a), svc("241.0.0.1", 80, UDP, a)},
			want:   []string{"put backend 2 10.1.0.1:8080", "put 241.0.0.1:80/udp slot 1 = 2/0", "put 241.0.0.1:80/udp slot 0 = 2/1"},
		},
		{
			name:   "an IPv4-mapped VIP is the IPv4 service",
			before: []Service{web(a)},
			after:  []Service{svc("::ffff:241.0.0.1", 80, TCP, be("::ffff:10.1.0.1", 8080, 1))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur, _ := synced(t, newTables(), tt.before...)
			next, ops := synced(t, cur, tt.after...)
			if got := opStrings(ops); !slices.Equal(got, tt.want) {
				t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			if got, want := next.services(), mustNormalize(t, tt.after); !sameServices(got, want) {
				t.Errorf("services after sync: %v, want %v", got, want)
			}
			if _, again := synced(t, next, tt.after...); len(again) != 0 {
				t.Errorf("a second sync with the same services writes %v", opStrings(again))
			}
		})
	}
}

func mustNormalize(t *testing.T, services []Service) []Service {
	t.Helper()
	n, err := normalizeServices(services)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sameServices compares services regardless of order, of services and of backends.
func sameServices(a, b []Service) bool {
	norm := func(ss []Service) map[string][]string {
		m := map[string][]string{}
		for _, s := range ss {
			var bs []string
			for _, b := range s.Backends {
				bs = append(bs, b.String())
			}
			slices.Sort(bs)
			m[s.String()] = bs
		}
		return m
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func TestSyncRepairsWhatAnInterruptedSyncLeftBehind(t *testing.T) {
	cur, _ := synced(t, newTables(), svc("241.0.0.1", 80, TCP, be("10.1.0.1", 80, 1), be("10.1.0.2", 80, 1)))
	k := svcKey{vip: ip("241.0.0.1"), port: 80, proto: TCP}
	cur.svc[slotKey{k, 3}] = slotVal{id: 9}                                                  // a slot beyond the count
	cur.backends[9] = backendVal{addr: ip("10.9.9.9"), port: 80, svcID: 1}                   // a backend no slot names
	cur.svc[slotKey{svcKey{vip: ip("241.0.0.9"), port: 80, proto: TCP}, 1}] = slotVal{id: 1} // a slot without its service
	cur.svc[slotKey{k, 2}] = slotVal{id: 42}                                                 // a slot naming a missing backend

	next, ops := synced(t, cur, svc("241.0.0.1", 80, TCP, be("10.1.0.1", 80, 1), be("10.1.0.2", 80, 1)))
	if err := consistent(next); err != nil {
		t.Fatal(err)
	}
	if len(next.svc) != 3 || len(next.backends) != 2 {
		t.Errorf("after repair: %d service entries and %d backends, want 3 and 2 (writes %v)", len(next.svc), len(next.backends), opStrings(ops))
	}
	if got := next.services(); len(got) != 1 || len(got[0].Backends) != 2 {
		t.Errorf("services after repair: %v", got)
	}
}

func TestIDsFreedInASyncAreNotReusedByIt(t *testing.T) {
	cur, _ := synced(t, newTables(), svc("241.0.0.1", 80, TCP, be("10.1.0.1", 80, 1)))
	_, ops := synced(t, cur, svc("241.0.0.2", 80, TCP, be("10.1.0.2", 80, 1)))
	for _, o := range ops {
		if o.kind == opPutBackend && o.id == 1 {
			t.Errorf("backend id 1 is reused while the hooks may still see it: %v", opStrings(ops))
		}
		if o.kind == opPutSlot && o.slot.slot == 0 && o.slotVal.id == 1 {
			t.Errorf("service id 1 is reused while the hooks may still see it: %v", opStrings(ops))
		}
	}
}

// Random sequences of syncs: after every single write, every service the hooks can see leads
// to backends of its own, and a service that has backends before and after never looks empty.
func TestNoWriteOfAnySyncLeavesAServiceWithoutItsBackends(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randomServices := func() []Service {
		var out []Service
		for v := range 4 {
			if rng.IntN(4) == 0 {
				continue
			}
			s := svc(fmt.Sprintf("241.0.0.%d", v+1), 80, []Proto{TCP, UDP}[v%2])
			for b := range 8 {
				if rng.IntN(2) == 0 {
					s.Backends = append(s.Backends, be(fmt.Sprintf("10.0.%d.%d", v, b+1), 8080, uint32(rng.IntN(3)+1)))
				}
			}
			rng.Shuffle(len(s.Backends), func(i, j int) { s.Backends[i], s.Backends[j] = s.Backends[j], s.Backends[i] })
			out = append(out, s)
		}
		return out
	}
	cur := newTables()
	for round := range 300 {
		want := randomServices()
		ops, err := planSync(cur, want, bigCapacity)
		if err != nil {
			t.Fatal(err)
		}
		hadBackends := map[svcKey]bool{}
		for _, s := range cur.services() {
			hadBackends[s.key()] = len(s.Backends) > 0
		}
		keepsBackends := map[svcKey]bool{}
		for _, s := range want {
			keepsBackends[s.key()] = hadBackends[s.key()] && len(s.Backends) > 0
		}
		for i, o := range ops {
			cur.apply(o)
			if err := consistent(cur); err != nil {
				t.Fatalf("round %d, after write %d (%s): %v", round, i, o, err)
			}
			for k, keep := range keepsBackends {
				if head, ok := cur.svc[slotKey{k, 0}]; keep && (!ok || head.count == 0) {
					t.Fatalf("round %d, after write %d (%s): %s has no backends for a moment", round, i, o, k)
				}
			}
		}
		if got := cur.services(); !sameServices(got, want) {
			t.Fatalf("round %d: services %v, want %v", round, got, want)
		}
		if again, _ := planSync(cur, want, bigCapacity); len(again) != 0 {
			t.Fatalf("round %d: second sync writes %v", round, opStrings(again))
		}
	}
}

func TestSyncRefusesWhatWouldNotFitInTheMaps(t *testing.T) {
	services := []Service{svc("241.0.0.1", 80, TCP, be("10.1.0.1", 80, 1), be("10.1.0.2", 80, 1))}
	if _, err := planSync(newTables(), services, capacity{svc: 2, backends: 10}); err == nil || !strings.Contains(err.Error(), "service map entries") {
		t.Errorf("3 service entries in a map of 2: err %v", err)
	}
	if _, err := planSync(newTables(), services, capacity{svc: 10, backends: 1}); err == nil || !strings.Contains(err.Error(), "backend map entries") {
		t.Errorf("2 backends in a map of 1: err %v", err)
	}
	// Replacing every backend needs room for old and new at once.
	cur, _ := synced(t, newTables(), services...)
	replaced := []Service{svc("241.0.0.1", 80, TCP, be("10.2.0.1", 80, 1), be("10.2.0.2", 80, 1))}
	if _, err := planSync(cur, replaced, capacity{svc: 10, backends: 3}); err == nil {
		t.Error("replacing 2 backends with 2 others in a map of 3 was not refused")
	}
}

func TestGoneListsBackendsNoServiceHasAnyMore(t *testing.T) {
	before := []Service{
		svc("241.0.0.1", 80, TCP, be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1)),
		svc("241.0.0.2", 53, UDP, be("10.1.0.1", 53, 1)),
	}
	tests := []struct {
		name  string
		after []Service
		want  []Endpoint
	}{
		{"nothing is gone when nothing changed", before, nil},
		{"a backend dropped from its service is gone", []Service{svc("241.0.0.1", 80, TCP, be("10.1.0.1", 8080, 1)), before[1]},
			[]Endpoint{{ip("10.1.0.2"), 8080, TCP}}},
		{"a backend that moved to another service of the same protocol is not gone", []Service{
			svc("241.0.0.1", 80, TCP, be("10.1.0.1", 8080, 1)), svc("241.0.0.3", 80, TCP, be("10.1.0.2", 8080, 1)), before[1]}, nil},
		{"a removed service's backends are gone with its protocol", []Service{before[0]},
			[]Endpoint{{ip("10.1.0.1"), 53, UDP}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Gone(before, tt.after); !slices.Equal(got, tt.want) {
				t.Errorf("Gone: %v, want %v", got, tt.want)
			}
		})
	}
}
