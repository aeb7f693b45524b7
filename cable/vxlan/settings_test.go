package vxlan

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

func TestParseSettings(t *testing.T) {
	tests := []struct {
		name    string
		in      cable.Settings
		want    config
		wantErr string
	}{
		{name: "no settings give the defaults", in: nil, want: config{Port: 4789, VNI: 100, Prefix: "cbl-vx"}},
		{name: "every key is taken", in: cable.Settings{"port": "4790", "vni": "7", "mtu": "1400", "interfacePrefix": "vx"},
			want: config{Port: 4790, VNI: 7, MTU: 1400, Prefix: "vx"}},
		{name: "the largest VNI is accepted", in: cable.Settings{"vni": "16777215"}, want: config{Port: 4789, VNI: 16777215, Prefix: "cbl-vx"}},
		{name: "MTU 0 is automatic", in: cable.Settings{"mtu": "0"}, want: config{Port: 4789, VNI: 100, Prefix: "cbl-vx"}},
		{name: "an unknown key is an error naming it and the known keys", in: cable.Settings{"interface": "x"},
			wantErr: `vxlan.interface: "x" is refused: unknown field "interface" (known: interfacePrefix, mtu, port, vni)`},
		{name: "port 0 is an error, not the default", in: cable.Settings{"port": "0"}, wantErr: "vxlan.port: 0 is not a UDP port"},
		{name: "a port above 65535 is an error", in: cable.Settings{"port": "65536"}, wantErr: "vxlan.port: 65536 is not a UDP port"},
		{name: "port 70000 is an error", in: cable.Settings{"port": "70000"}, wantErr: "vxlan.port: 70000 is not a UDP port"},
		{name: "a port with a plus sign is an error", in: cable.Settings{"port": "+4789"}, wantErr: `vxlan.port: "+4789" is not a UDP port`},
		{name: "VNI 0 is an error", in: cable.Settings{"vni": "0"}, wantErr: "vxlan.vni: 0 is out of range"},
		{name: "a VNI above 24 bits is an error", in: cable.Settings{"vni": "16777216"}, wantErr: "vxlan.vni: 16777216 is out of range"},
		{name: "a VNI with leading zeros is an error", in: cable.Settings{"vni": "0100"}, wantErr: `vxlan.vni: "0100"`},
		{name: "an MTU below 576 is an error", in: cable.Settings{"mtu": "575"}, wantErr: "vxlan.mtu: 575 is out of range"},
		{name: "an MTU of 500 is an error", in: cable.Settings{"mtu": "500"}, wantErr: "vxlan.mtu: 500 is out of range"},
		{name: "a non-numeric MTU is an error", in: cable.Settings{"mtu": "big"}, wantErr: `vxlan.mtu: "big"`},
		{name: "a prefix longer than 6 bytes is an error", in: cable.Settings{"interfacePrefix": "cbl-vxl"}, wantErr: `vxlan.interfacePrefix: "cbl-vxl" is 7 bytes`},
		{name: "an empty prefix is an error", in: cable.Settings{"interfacePrefix": ""}, wantErr: `vxlan.interfacePrefix: "" is empty`},
		{name: "a prefix with a slash is an error", in: cable.Settings{"interfacePrefix": "a/b"}, wantErr: `vxlan.interfacePrefix: "a/b" has the invalid character`},
		{name: "with several bad keys the first in order is reported", in: cable.Settings{"vni": "x", "mtu": "y"}, wantErr: `vxlan.mtu: "y"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSettings(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("config = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name    string
		in      cable.Options
		want    pairOptions
		wantErr string
	}{
		{name: "no options set nothing", in: nil},
		{name: "vni, port and mtu are taken", in: cable.Options{"vni": "200", "port": "4791", "mtu": "1400"}, want: pairOptions{VNI: 200, Port: 4791, MTU: 1400}},
		{name: "an unknown key is an error naming key and value", in: cable.Options{"vniid": "5"}, wantErr: `vxlan option vniid="5": unknown key`},
		{name: "a bad VNI is an error naming it", in: cable.Options{"vni": "-1"}, wantErr: `vxlan option vni="-1"`},
		{name: "a bad port is an error naming it", in: cable.Options{"port": "udp"}, wantErr: `vxlan option port="udp"`},
		{name: "a bad MTU is an error naming it", in: cable.Options{"mtu": "70000"}, wantErr: `vxlan option mtu="70000"`},
		{name: "a value with spaces is an error", in: cable.Options{"mtu": " 1400"}, wantErr: `mtu=" 1400"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseOptions(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("options = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseOptions(f *testing.F) {
	f.Add("vni", "200", "port", "4791")
	f.Add("mtu", "1400", "vni", "16777215")
	f.Add("port", "0", "x", "")
	f.Add("mtu", "+1400", "vni", "0x10")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		o := cable.Options{k1: v1, k2: v2}
		p, err := parseOptions(o)
		if err != nil {
			// An error names a key and its value, so an operator can find the bad option.
			named := false
			for k, v := range o {
				if strings.Contains(err.Error(), k+"="+strconv.Quote(v)) {
					named = true
				}
			}
			if !named {
				t.Fatalf("error %q names no key=value of %v", err, o)
			}
			return
		}
		if p.VNI != 0 && (p.VNI < 1 || p.VNI > MaxVNI) || p.Port < 0 || p.Port > 65535 || p.MTU != 0 && (p.MTU < MinMTU || p.MTU > MaxMTU) {
			t.Fatalf("accepted out-of-range options %+v from %v", p, o)
		}
		for k := range o {
			if k != keyVNI && k != keyPort && k != keyMTU {
				t.Fatalf("accepted unknown key %q", k)
			}
		}
		// Whatever is accepted resolves to a usable device name.
		pr, err := resolvePair(config{Port: DefaultPort, VNI: DefaultVNI, Prefix: DefaultInterfacePrefix}, p, 4789, MaxMTU)
		if err != nil {
			t.Fatalf("resolvePair of accepted %+v: %v", p, err)
		}
		if len(pr.Device) > 15 || !strings.HasPrefix(pr.Device, DefaultInterfacePrefix) {
			t.Fatalf("device name %q for %+v", pr.Device, p)
		}
	})
}

func TestDeviceName(t *testing.T) {
	tests := []struct {
		name           string
		prefix         string
		vni, port, own int
		want           string
	}{
		{"the node's own port gives prefix and VNI", "cbl-vx", 100, 4789, 4789, "cbl-vx100"},
		{"the largest VNI on the node's port still fits", "cbl-vx", MaxVNI, 4789, 4789, "cbl-vx16777215"},
		{"another port is appended after a p", "cbl-vx", 200, 4791, 4789, "cbl-vx200p4791"},
		{"a name too long for the kernel is hashed", "cbl-vx", 1234567, 65000, 4789, "cbl-vxh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := deviceName(tt.prefix, tt.vni, tt.port, tt.own)
			if !strings.HasPrefix(got, tt.want) || (!strings.HasSuffix(tt.want, "h") && got != tt.want) {
				t.Errorf("deviceName = %q, want %q", got, tt.want)
			}
			if len(got) > 15 {
				t.Errorf("deviceName = %q is longer than 15 bytes", got)
			}
			if err := cable.CheckLinkName(got, cable.MaxLinkName); err != nil {
				t.Errorf("deviceName = %q: %v", got, err)
			}
		})
	}
	if a, b := deviceName("cbl-vx", 1234567, 65000, 4789), deviceName("cbl-vx", 1234567, 65001, 4789); a == b {
		t.Errorf("two ports hash to the same name %q", a)
	}
}

func TestResolvePair(t *testing.T) {
	node := config{Port: 4789, VNI: 100, Prefix: "cbl-vx"}
	tests := []struct {
		name       string
		opts       pairOptions
		remotePort uint16
		want       pair
		wantErr    string
	}{
		{name: "without options the node's VNI and port are used and packets go to the remote's port",
			remotePort: 4790, want: pair{VNI: 100, Port: 4789, DstPort: 4790, MTU: 1450, Device: "cbl-vx100"}},
		{name: "a policy port is used by both ends whatever the remote publishes",
			opts: pairOptions{Port: 4791}, remotePort: 4790, want: pair{VNI: 100, Port: 4791, DstPort: 4791, MTU: 1450, Device: "cbl-vx100p4791"}},
		{name: "a policy VNI gets its own device",
			opts: pairOptions{VNI: 200}, remotePort: 4789, want: pair{VNI: 200, Port: 4789, DstPort: 4789, MTU: 1450, Device: "cbl-vx200"}},
		{name: "a smaller policy MTU is taken for the pair's routes",
			opts: pairOptions{MTU: 1400}, remotePort: 4789, want: pair{VNI: 100, Port: 4789, DstPort: 4789, MTU: 1400, Device: "cbl-vx100"}},
		{name: "a policy MTU above the device's is an error naming it", opts: pairOptions{MTU: 1500}, remotePort: 4789, wantErr: `mtu="1500"`},
		{name: "no remote port and no policy port is an error", remotePort: 0, wantErr: "publishes no vxlan port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolvePair(node, tt.opts, tt.remotePort, 1450)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("pair = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDefaultMTU(t *testing.T) {
	for _, tt := range []struct{ underlay, want int }{{1500, 1450}, {9000, 8950}, {600, MinMTU}} {
		if got := defaultMTU(tt.underlay); got != tt.want {
			t.Errorf("defaultMTU(%d) = %d, want %d", tt.underlay, got, tt.want)
		}
	}
}

func TestNewDriverValidatesTheNode(t *testing.T) {
	good := cable.LocalNode{Cluster: "a", Node: "gw", StateDir: t.TempDir(), AdvertiseAddress: netip.MustParseAddr("10.252.0.1")}
	tests := []struct {
		name     string
		mutate   func(*cable.LocalNode)
		settings cable.Settings
		wantErr  string
	}{
		{"a node with an IPv4 advertise address and a state dir is accepted", func(*cable.LocalNode) {}, nil, ""},
		{"an IPv6 advertise address is an error naming it", func(n *cable.LocalNode) { n.AdvertiseAddress = netip.MustParseAddr("fd00::1") }, nil, `"fd00::1" is not IPv4`},
		{"no advertise address is an error", func(n *cable.LocalNode) { n.AdvertiseAddress = netip.Addr{} }, nil, "not IPv4"},
		{"an empty state dir is an error", func(n *cable.LocalNode) { n.StateDir = "" }, nil, "empty StateDir"},
		{"a bad setting is an error naming it", func(*cable.LocalNode) {}, cable.Settings{"vni": "0"}, "vxlan.vni: 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := good
			tt.mutate(&n)
			d, err := NewDriver(n, tt.settings)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.VTEP().String() != "240.252.0.1" || d.LocalEndpoint().Port != DefaultPort || d.Name() != "vxlan" {
				t.Errorf("driver VTEP %s port %d name %s", d.VTEP(), d.LocalEndpoint().Port, d.Name())
			}
		})
	}
}

func TestTheDriverIsRegistered(t *testing.T) {
	d, err := cable.New("vxlan", cable.LocalNode{Cluster: "a", Node: "gw", StateDir: t.TempDir(),
		AdvertiseAddress: netip.MustParseAddr("10.252.0.1")}, cable.Settings{"port": "4790"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name() != Name || d.LocalEndpoint().Port != 4790 {
		t.Errorf("registry gave %s with port %d", d.Name(), d.LocalEndpoint().Port)
	}
}
