package meshaddr

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRange(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // the prefix, or a fragment of the error
		ok       bool
	}{
		{"the default is accepted", DefaultRange, "242.0.0.0/16", true},
		{"a /30 is the smallest accepted", "10.99.0.0/30", "10.99.0.0/30", true},
		{"a /8 is the largest accepted", "242.0.0.0/8", "242.0.0.0/8", true},
		{"a /31 is too small", "242.0.0.0/31", `"242.0.0.0/31": the prefix length must be /8 to /30`, false},
		{"a /7 is too large", "240.0.0.0/7", `"240.0.0.0/7": the prefix length must be /8 to /30`, false},
		{"IPv6 is refused", "fd00::/64", `"fd00::/64" is not IPv4`, false},
		{"an IPv4-mapped IPv6 range is refused", "::ffff:242.0.0.0/112", "is not IPv4", false},
		{"host bits are refused with the masked form", "242.0.0.1/16", "did you mean 242.0.0.0/16", false},
		{"garbage is refused naming it", "nope", `"nope" is not a CIDR`, false},
		{"empty is refused", "", `"" is not a CIDR`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseRange(tt.in)
			if tt.ok {
				if err != nil || p.String() != tt.want {
					t.Fatalf("ParseRange(%q) = %v, %v; want %s", tt.in, p, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseRange(%q) error = %v; want it to contain %q", tt.in, err, tt.want)
			}
		})
	}
}

func TestCheckDisjoint(t *testing.T) {
	r := netip.MustParsePrefix("242.0.0.0/16")
	if err := CheckDisjoint(r, []netip.Prefix{netip.MustParsePrefix("241.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}); err != nil {
		t.Errorf("disjoint ranges refused: %v", err)
	}
	err := CheckDisjoint(r, []netip.Prefix{netip.MustParsePrefix("240.0.0.0/4")})
	if err == nil || !strings.Contains(err.Error(), "242.0.0.0/16 overlaps the service VIP range 240.0.0.0/4") {
		t.Errorf("overlap error = %v", err)
	}
}

func TestAllocateSkipsNetworkBroadcastAndUsed(t *testing.T) {
	r := netip.MustParsePrefix("10.0.0.0/30") // .1 and .2 usable
	used := map[netip.Addr]bool{}
	a, err := Allocate(r, used)
	if err != nil || a != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("first = %v, %v; want 10.0.0.1", a, err)
	}
	used[a] = true
	b, err := Allocate(r, used)
	if err != nil || b != netip.MustParseAddr("10.0.0.2") {
		t.Fatalf("second = %v, %v; want 10.0.0.2", b, err)
	}
	used[b] = true
	_, err = Allocate(r, used)
	if err == nil || !strings.Contains(err.Error(), "mesh address range 10.0.0.0/30 is exhausted") {
		t.Fatalf("exhausted error = %v", err)
	}
	// A freed address is handed out again, the lowest first.
	delete(used, a)
	if c, err := Allocate(r, used); err != nil || c != a {
		t.Fatalf("after release = %v, %v; want %v", c, err, a)
	}
	// Addresses used outside the range (a range changed since) do not end the scan early.
	used = map[netip.Addr]bool{netip.MustParseAddr("192.168.0.1"): true, netip.MustParseAddr("10.0.0.1"): true}
	if c, err := Allocate(r, used); err != nil || c != netip.MustParseAddr("10.0.0.2") {
		t.Fatalf("with foreign used = %v, %v; want 10.0.0.2", c, err)
	}
}

func TestUsable(t *testing.T) {
	r := netip.MustParsePrefix("242.0.0.0/16")
	for _, tt := range []struct {
		a    string
		want bool
	}{{"242.0.0.0", false}, {"242.0.0.1", true}, {"242.0.255.254", true}, {"242.0.255.255", false}, {"242.1.0.1", false}, {"::1", false}} {
		if got := Usable(r, netip.MustParseAddr(tt.a)); got != tt.want {
			t.Errorf("Usable(%s) = %v, want %v", tt.a, got, tt.want)
		}
	}
}

func FuzzParseRange(f *testing.F) {
	for _, s := range []string{DefaultRange, "10.0.0.0/30", "fd00::/64", "242.0.0.1/16", "", "1.2.3.4/33", "0.0.0.0/8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseRange(s)
		if err != nil {
			return
		}
		if !p.Addr().Is4() || p != p.Masked() || p.Bits() < MinBits || p.Bits() > MaxBits {
			t.Fatalf("ParseRange(%q) accepted %v", s, p)
		}
		// Every accepted range has an address to give.
		a, err := Allocate(p, nil)
		if err != nil || !Usable(p, a) {
			t.Fatalf("Allocate(%v) = %v, %v", p, a, err)
		}
	})
}
