package bpf

import (
	"net/netip"
	"testing"
)

// servicesFromBytes builds services of any shape, valid or not, from fuzz input.
func servicesFromBytes(data []byte) []Service {
	next := func(n int) []byte {
		if len(data) < n {
			data = append(data, make([]byte, n-len(data))...)
		}
		b := data[:n]
		data = data[n:]
		return b
	}
	addr := func() netip.Addr {
		switch k := next(1)[0] % 4; k {
		case 0:
			return netip.Addr{}
		case 1, 2:
			return netip.AddrFrom4([4]byte(next(4)))
		default:
			return netip.AddrFrom16([16]byte(next(16)))
		}
	}
	port := func() uint16 { b := next(2); return uint16(b[0])<<8 | uint16(b[1]) }
	var out []Service
	for n := int(next(1)[0] % 6); n > 0; n-- {
		s := Service{VIP: addr(), Port: port(), Proto: []Proto{TCP, UDP, SCTP, Proto(next(1)[0])}[next(1)[0]%4]}
		for m := int(next(1)[0] % 8); m > 0; m-- {
			s.Backends = append(s.Backends, Backend{Addr: addr(), Port: port(), ClusterID: uint32(next(1)[0])})
		}
		out = append(out, s)
	}
	return out
}

// Whatever the services, planning never panics, and a plan it accepts leads to exactly the
// services asked for, after which a second plan is empty.
func FuzzPlanSyncEitherRefusesOrConverges(f *testing.F) {
	one := []byte{1, 1, 241, 0, 0, 1, 0, 80, 0, 0, 2, 1, 10, 1, 0, 1, 31, 144, 1, 1, 10, 1, 0, 2, 31, 144, 2}
	f.Add(one, []byte{})
	f.Add(one, one[:20])
	f.Add([]byte{3, 3, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 53, 1}, one)
	f.Fuzz(func(t *testing.T, first, second []byte) {
		cur := newTables()
		for _, in := range [][]byte{first, second} {
			services := servicesFromBytes(in)
			ops, err := planSync(cur, services, capacity{svc: 64, backends: 64})
			if err != nil {
				continue
			}
			for _, o := range ops {
				cur.apply(o)
			}
			want, _ := normalizeServices(services)
			if got := cur.services(); !sameServices(got, want) {
				t.Fatalf("after the sync: %v, want %v", got, want)
			}
			if again, _ := planSync(cur, services, capacity{svc: 64, backends: 64}); len(again) != 0 {
				t.Fatalf("second plan writes %v", opStrings(again))
			}
		}
	})
}
