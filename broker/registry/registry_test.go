package registry

import (
	"net/netip"
	"strings"
	"testing"
)

func TestClusterNames(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{"a lower-case word is a name", "east", ""},
		{"digits and dashes inside are allowed", "eu-west-1", ""},
		{"an empty name is refused", "", "cluster name is empty"},
		{"upper case is refused", "East", `cluster name "East" is not a DNS label`},
		{"an underscore is refused", "a_b", `"a_b" is not a DNS label`},
		{"a leading dash is refused", "-a", `"-a" is not a DNS label`},
		{"a dot is refused (a label, not a subdomain)", "a.b", `"a.b" is not a DNS label`},
		{"64 characters are too many", strings.Repeat("a", 64), "at most 63"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, ValidateClusterName(tt.in), tt.wantErr)
		})
	}
}

func TestCIDRParsing(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    []string
		wantErr string
	}{
		{"one network", []string{"10.1.0.0/16"}, []string{"10.1.0.0/16"}, ""},
		{"a comma list and a repeated flag mean the same", []string{"10.1.0.0/16,10.2.0.0/16", "fd00::/64"}, []string{"10.1.0.0/16", "10.2.0.0/16", "fd00::/64"}, ""},
		{"empty pieces are skipped", []string{"", " 10.1.0.0/16 ,"}, []string{"10.1.0.0/16"}, ""},
		{"host bits are refused with the network suggested", []string{"10.1.2.3/16"}, nil, `pod CIDR "10.1.2.3/16" has host bits set (did you mean 10.1.0.0/16?)`},
		{"a bare address is refused", []string{"10.1.0.0"}, nil, `pod CIDR "10.1.0.0" is not a CIDR`},
		{"garbage is refused", []string{"ten/8"}, nil, `pod CIDR "ten/8" is not a CIDR`},
		{"overlaps within one request are refused", []string{"10.0.0.0/8", "10.1.0.0/16"}, nil, "pod CIDR 10.1.0.0/16 overlaps pod CIDR 10.0.0.0/8"},
		{"IPv4-mapped IPv6 is refused", []string{"::ffff:10.0.0.0/104"}, nil, "IPv4-mapped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCIDRs("pod CIDR", tt.in)
			checkErr(t, err, tt.wantErr)
			if err == nil && strings.Join(Strings(got), " ") != strings.Join(tt.want, " ") {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestOverlapCheck(t *testing.T) {
	existing := []ClusterCIDRs{
		{Name: "east", PodCIDRs: pfx("10.1.0.0/16"), ServiceCIDRs: pfx("10.96.0.0/16")},
		{Name: "west", PodCIDRs: pfx("10.2.0.0/16")},
	}
	tests := []struct {
		name    string
		c       ClusterCIDRs
		wantErr string
	}{
		{"disjoint CIDRs are accepted", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.97.0.0/16")}, ""},
		{"a pod CIDR inside another cluster's pod CIDR is refused, naming both", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.1.128.0/17")},
			`pod CIDR 10.1.128.0/17 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`},
		{"a pod CIDR containing another cluster's is refused", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.0.0.0/8")},
			`pod CIDR 10.0.0.0/8 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`},
		{"service CIDRs may not overlap either", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.96.0.0/12")},
			`service CIDR 10.96.0.0/12 of cluster "north" overlaps service CIDR 10.96.0.0/16 of cluster "east"`},
		{"a pod CIDR may not overlap another cluster's service CIDR", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.96.1.0/24")},
			`pod CIDR 10.96.1.0/24 of cluster "north" overlaps service CIDR 10.96.0.0/16 of cluster "east"`},
		{"a cluster's own pod and service CIDRs may not overlap", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.3.1.0/24")},
			`pod CIDR 10.3.0.0/16 overlaps its own service CIDR 10.3.1.0/24`},
		{"IPv4 and IPv6 never overlap", ClusterCIDRs{Name: "north", PodCIDRs: pfx("::/0")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, CheckOverlap(tt.c, existing), tt.wantErr)
		})
	}
}

func TestIDAllocationTakesTheLowestFreeIDAndRefusesTheTwoHundredFiftySixth(t *testing.T) {
	used := map[uint32]bool{}
	for want := uint32(1); want <= 255; want++ {
		id, err := AllocateID(used)
		if err != nil || id != want {
			t.Fatalf("allocation %d: got %d, %v", want, id, err)
		}
		used[id] = true
	}
	if _, err := AllocateID(used); err == nil || !strings.HasPrefix(err.Error(), "mesh is full: ") {
		t.Fatalf("256th allocation: %v, want 'mesh is full: ...'", err)
	}
	delete(used, 17)
	delete(used, 200)
	if id, _ := AllocateID(used); id != 17 {
		t.Fatalf("after freeing 17 and 200 got %d, want 17", id)
	}
}

func TestSubnetWithinClusterCIDRs(t *testing.T) {
	in := pfx("10.1.0.0/16", "fd00::/64")
	tests := []struct {
		name string
		s    string
		want bool
	}{
		{"the CIDR itself", "10.1.0.0/16", true},
		{"a smaller piece", "10.1.5.0/24", true},
		{"a larger one", "10.0.0.0/8", false},
		{"another range", "10.2.0.0/24", false},
		{"an IPv6 piece", "fd00::/80", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Within(netip.MustParsePrefix(tt.s), in); got != tt.want {
				t.Fatalf("Within(%s) = %v, want %v", tt.s, got, tt.want)
			}
		})
	}
}

func TestLabels(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr string
	}{
		{"simple pairs", "env=prod,region=eu", map[string]string{"env": "prod", "region": "eu"}, ""},
		{"a prefixed key", "cablemesh.io/site=onprem", map[string]string{"cablemesh.io/site": "onprem"}, ""},
		{"an empty value is allowed", "gpu=", map[string]string{"gpu": ""}, ""},
		{"nothing gives no labels", "", map[string]string{}, ""},
		{"a pair without '=' is refused", "env", nil, `label "env" is not key=value`},
		{"a bad key is refused, named", "-env=prod", nil, `label key "-env"`},
		{"a bad value is refused, named", "env=pro d", nil, `label "env": value "pro d"`},
		{"a long value is refused", "env=" + strings.Repeat("x", 64), nil, "at most 63"},
		{"a bad prefix is refused", "Foo_Bar/x=y", nil, `prefix "Foo_Bar" is not a DNS subdomain`},
		{"the same key twice with different values is refused", "a=1,a=2", nil, `label "a" given twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLabels(tt.in)
			checkErr(t, err, tt.wantErr)
			if err == nil && len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestLabelChanges(t *testing.T) {
	set, remove, err := ParseLabelChanges([]string{"env=prod", "old-", "tier=", "old-"})
	if err != nil || set["env"] != "prod" || set["tier"] != "" || len(set) != 2 || len(remove) != 1 || remove[0] != "old" {
		t.Fatalf("got set %v remove %v err %v", set, remove, err)
	}
	for _, bad := range [][]string{{"env"}, {"a=1", "a-"}, {"a-", "a=1"}, {"-"}, {"Bad Key=1"}} {
		if _, _, err := ParseLabelChanges(bad); err == nil {
			t.Errorf("ParseLabelChanges(%q) accepted", bad)
		}
	}
}

func TestNodeNames(t *testing.T) {
	for _, ok := range []string{"gw1", "east-gw1", "node.example.com"} {
		if err := ValidateNodeName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "GW1", "a/b", "a..b", strings.Repeat("a", 254)} {
		if err := ValidateNodeName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}
