package config

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// issue3Example is the driver part of the documented config, on top of issueExample.
const issue3Example = issueExample + `cableDrivers: [wireguard, vxlan, ipsec]
vxlan: {port: 4789, vni: 100, mtu: 0}
ipsec: {port: 500, nattPort: 4500, mtu: 0, charon: /usr/lib/ipsec/charon, useSystemCharon: ""}
`

func TestTheIssue3DriverConfigDecodes(t *testing.T) {
	c, err := Parse([]byte(issue3Example))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !slices.Equal(c.CableDrivers, []string{"wireguard", "vxlan", "ipsec"}) ||
		!maps.Equal(c.Drivers["vxlan"], cable.Settings{"port": "4789", "vni": "100", "mtu": "0"}) ||
		!maps.Equal(c.Drivers["ipsec"], cable.Settings{"port": "500", "nattPort": "4500", "mtu": "0", "charon": "/usr/lib/ipsec/charon", "useSystemCharon": ""}) {
		t.Errorf("decoded %v %v", c.CableDrivers, c.Drivers)
	}
}

// TestCableDriversDefaultToEveryRegisteredDriverButTheOptInOnes: vxlan+ipsec needs kernel ESP,
// so an agent runs it only when its config names it.
func TestCableDriversDefaultToEveryRegisteredDriverButTheOptInOnes(t *testing.T) {
	c, err := Parse([]byte(issueExample))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.CableDrivers, []string{"ipsec", "vxlan", "wireguard"}) {
		t.Errorf("default cableDrivers = %v, want [ipsec vxlan wireguard] (registered: %v)", c.CableDrivers, cable.Names())
	}
	if !slices.Contains(cable.Names(), "vxlan+ipsec") {
		t.Errorf("vxlan+ipsec is not registered: %v", cable.Names())
	}
}

func TestDriverBlocksReachTheDriverAsWritten(t *testing.T) {
	tests := []struct {
		name   string
		yaml   string
		driver string
		want   cable.Settings
	}{
		{"a block holds exactly the keys the operator wrote, no defaults", "", "wireguard", cable.Settings{"interface": "cbl-wg0", "port": "51820"}},
		{"a driver without a block has no settings", "", "vxlan", nil},
		{"a block in block style decodes like a flow one", "vxlan:\n  mtu: 1400\n  vni: 7\n", "vxlan", cable.Settings{"mtu": "1400", "vni": "7"}},
		{"a hexadecimal integer reaches the driver in decimal", "vxlan: {vni: 0x10}\n", "vxlan", cable.Settings{"vni": "16"}},
		{"a quoted number stays as written", "vxlan: {vni: \"007\"}\n", "vxlan", cable.Settings{"vni": "007"}},
		{"a null value is empty text", "ipsec:\n  useSystemCharon:\n", "ipsec", cable.Settings{"useSystemCharon": ""}},
		{"an empty block is no settings", "ipsec:\n", "ipsec", cable.Settings{}},
		{"an alias is followed to its scalar", "vxlan: {vni: &v 9, port: 4790}\nipsec: {mtu: 1400}\n", "vxlan", cable.Settings{"vni": "9", "port": "4790"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Decode([]byte(issueExample + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := c.Drivers[tt.driver]
			if ok != (tt.want != nil) || !maps.Equal(got, tt.want) {
				t.Errorf("settings = %v (present %v), want %v", got, ok, tt.want)
			}
		})
	}
}

func TestBadDriverConfigIsRejectedNamingTheField(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"an empty driver list", "cableDrivers: []\n", "cableDrivers: is empty"},
		{"a driver listed twice", "cableDrivers: [vxlan, vxlan]\n", `cableDrivers[1]: "vxlan" is listed twice`},
		{"a driver name that is no name", "cableDrivers: [Wire Guard]\n", `cableDrivers[0]: "Wire Guard" is not a driver name`},
		{"a driver that is not registered", "cableDrivers: [wireguard, gre]\n", `cableDrivers[1]: "gre" is not a registered cable driver (have ipsec, vxlan, vxlan+ipsec, wireguard)`},
		{"an unknown vxlan field", "vxlan: {vnid: 3}\n", `unknown field "vnid"`},
		{"a VNI over 24 bits", "vxlan: {vni: 16777216}\n", "vxlan.vni: 16777216 is out of range"},
		{"a vxlan port out of range", "vxlan: {port: 70000}\n", "vxlan.port: 70000 is not a UDP port"},
		{"a vxlan MTU too small", "vxlan: {mtu: 500}\n", "vxlan.mtu: 500 is out of range"},
		{"equal IKE and NAT-T ports", "ipsec: {port: 4500}\n", "ipsec.nattPort: 4500 equals ipsec.port"},
		{"a relative charon path", "ipsec: {charon: charon}\n", `ipsec.charon: "charon" is not an absolute path`},
		{"a relative system charon socket", "ipsec: {useSystemCharon: charon.vici}\n", `ipsec.useSystemCharon: "charon.vici" is not an absolute path`},
		{"a port with a system charon", "ipsec: {useSystemCharon: /run/charon.vici, port: 500}\n", "ipsec.port: must be unset with ipsec.useSystemCharon"},
		{"an ipsec MTU below IPv6's minimum", "ipsec: {mtu: 1000}\n", "ipsec.mtu: 1000 is out of range"},
		{"a driver block not in cableDrivers is validated all the same", "cableDrivers: [wireguard]\nvxlan: {vni: 0}\n", "vxlan.vni: 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(issueExample + tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// The driver blocks are decoded by this package, not by the drivers: the shape of a block and
// the place of an error in the file are this package's to report.
func TestDriverBlocksAreDecodedStrictlyWithLines(t *testing.T) {
	// issueExample has 10 lines; the block starts on line 11.
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"a list as a setting value names the setting and its line", "vxlan:\n  vni: [1, 2]\n", []string{"line 12", "vxlan.vni", "not a sequence"}},
		{"a mapping as a setting value names the setting and its line", "ipsec:\n  mtu: {a: 1}\n", []string{"line 12", "ipsec.mtu", "not a mapping"}},
		{"a block that is a scalar names the driver and its line", "vxlan: 4789\n", []string{"line 11", "vxlan: want a mapping"}},
		{"a block that is a list names the driver", "vxlan: [port, 4789]\n", []string{"line 11", "vxlan: want a mapping", "a sequence"}},
		{"a setting given twice names the setting and both lines", "vxlan:\n  vni: 1\n  vni: 2\n", []string{"line 13", "vxlan.vni: is set twice (first on line 12)"}},
		{"an unknown top-level key that is no driver is an unknown field with its line", "gre: {key: 1}\n", []string{"line 11", `unknown field "gre"`}},
		{"unknown fields of the config and of a nested struct are reported in file order", "bogus: 1\nhealthCheck: {interval: 3s}\n",
			[]string{`line 11: unknown field "bogus"; line 12: unknown field "interval"`}},
		{"a driver's error carries the line of the setting it names", "vxlan:\n  port: 4789\n  vni: 0\n", []string{"line 13: vxlan.vni"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(issueExample + tt.yaml))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tt.yaml)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestAConfigBuiltInCodeIsValidatedByItsDrivers(t *testing.T) {
	c := &Config{Cluster: "east", Node: "n1", Broker: "b:1", Drivers: map[string]cable.Settings{"vxlan": {"vni": "0"}}}
	c.ApplyDefaults(nil)
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "vxlan.vni") {
		t.Errorf("Validate = %v, want the driver's error without a line", err)
	}
}
