package validation

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

func TestNodeNameFromHost(t *testing.T) {
	tests := []struct{ host, want string }{
		{"gw1", "gw1"},
		{"Host-A", "host-a"},
		{"node1.example.com.", "node1.example.com"},
		{"GW_1", "gw_1"}, // still not a node name: the agent asks for an explicit one
	}
	for _, tt := range tests {
		if got := NodeNameFromHost(tt.host); got != tt.want {
			t.Errorf("NodeNameFromHost(%q) = %q, want %q", tt.host, got, tt.want)
		}
	}
	if err := ValidateNodeName(NodeNameFromHost("GW_1")); err == nil {
		t.Error(`a host name with "_" became a valid node name`)
	}
}

func TestClusterCIDRsMayNotTouchReservedRanges(t *testing.T) {
	for _, tt := range []struct {
		cidr string
		ok   bool
		want string
	}{
		{"10.1.0.0/16", true, ""},
		{"172.16.0.0/12", true, ""},
		{"fd00:10::/64", true, ""},
		{"0.0.0.0/0", false, "default route"},
		{"::/0", false, "default route"},
		{"0.0.0.0/8", false, "unspecified"},
		{"0.0.0.0/1", false, "unspecified"},
		{"127.0.0.0/8", false, "loopback"},
		{"126.0.0.0/7", false, "loopback"},
		{"169.254.0.0/16", false, "link-local"},
		{"224.0.0.0/4", false, "multicast"},
		{"239.1.0.0/16", false, "multicast"},
		{"255.255.255.255/32", false, "broadcast"},
		{"::1/128", false, "loopback"},
		{"fe80::/10", false, "link-local"},
		{"ff00::/8", false, "multicast"},
	} {
		err := CheckClusterCIDR("pod CIDR", netip.MustParsePrefix(tt.cidr))
		if tt.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v; want ok=%v or an error saying %q", tt.cidr, err, tt.ok, tt.want)
		}
	}
}
