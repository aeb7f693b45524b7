package config

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// issue3Example is the driver part of issue 3's agent config, on top of issue 2's example.
const issue3Example = issueExample + `cableDrivers: [wireguard, vxlan, ipsec]
vxlan: {port: 4789, vni: 100, mtu: 0}
ipsec: {port: 500, nattPort: 4500, mtu: 0, charon: /usr/lib/ipsec/charon, useSystemCharon: ""}
`

func TestTheIssue3DriverConfigDecodes(t *testing.T) {
	c, err := Parse([]byte(issue3Example))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !slices.Equal(c.CableDrivers, []string{"wireguard", "vxlan", "ipsec"}) || c.VXLAN != (VXLAN{Port: 4789, VNI: 100}) ||
		c.IPsec != (IPsec{Port: 500, NATTPort: 4500, Charon: "/usr/lib/ipsec/charon"}) {
		t.Errorf("decoded %+v %+v %+v", c.CableDrivers, c.VXLAN, c.IPsec)
	}
}

func TestDriverDefaultsAndSettings(t *testing.T) {
	c, err := Parse([]byte(issueExample))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.CableDrivers, []string{"wireguard", "vxlan", "ipsec"}) {
		t.Errorf("default cableDrivers = %v", c.CableDrivers)
	}
	tests := []struct {
		name   string
		yaml   string
		driver string
		want   map[string]string
	}{
		{"wireguard settings are the wireguard section", "", "wireguard", map[string]string{"interface": "cbl-wg0", "port": "51820"}},
		{"vxlan settings default to port 4789 and VNI 100", "", "vxlan", map[string]string{"port": "4789", "vni": "100"}},
		{"a vxlan MTU is passed on", "vxlan: {mtu: 1400, vni: 7}\n", "vxlan", map[string]string{"port": "4789", "vni": "7", "mtu": "1400"}},
		{"ipsec settings default to the driver's own charon", "", "ipsec", map[string]string{"port": "500", "nattPort": "4500", "charon": "/usr/lib/ipsec/charon"}},
		{"a system charon leaves ports and binary to it", "ipsec: {useSystemCharon: /var/run/charon.vici, mtu: 1400}\n", "ipsec",
			map[string]string{"useSystemCharon": "/var/run/charon.vici", "mtu": "1400"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(issueExample + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.DriverSettings(tt.driver); !maps.Equal(got, tt.want) {
				t.Errorf("settings = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBadDriverConfigIsRejectedNamingTheField(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"an empty driver list", "cableDrivers: []\n", "cableDrivers: is empty"},
		{"a driver listed twice", "cableDrivers: [vxlan, vxlan]\n", `cableDrivers[1]: "vxlan" is listed twice`},
		{"a driver name that is no name", "cableDrivers: [Wire Guard]\n", `cableDrivers[0]: "Wire Guard" is not a driver name`},
		{"an unknown vxlan field", "vxlan: {vnid: 3}\n", `unknown field "vnid"`},
		{"a VNI over 24 bits", "vxlan: {vni: 16777216}\n", "vxlan.vni: 16777216 is out of range"},
		{"a vxlan port out of range", "vxlan: {port: 70000}\n", "vxlan.port: 70000 is not a UDP port"},
		{"a vxlan MTU too small", "vxlan: {mtu: 500}\n", "vxlan.mtu: 500 is out of range"},
		{"equal IKE and NAT-T ports", "ipsec: {port: 4500}\n", "ipsec.nattPort: 4500 equals ipsec.port"},
		{"a relative charon path", "ipsec: {charon: charon}\n", `ipsec.charon: "charon" is not an absolute path`},
		{"a relative system charon socket", "ipsec: {useSystemCharon: charon.vici}\n", `ipsec.useSystemCharon: "charon.vici" is not an absolute path`},
		{"a port with a system charon", "ipsec: {useSystemCharon: /run/charon.vici, port: 500}\n", "ipsec.port: must be unset with ipsec.useSystemCharon"},
		{"an ipsec MTU below IPv6's minimum", "ipsec: {mtu: 1000}\n", "ipsec.mtu: 1000 is out of range"},
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

func TestCheckRegistered(t *testing.T) {
	c, err := Parse([]byte(issueExample + "cableDrivers: [wireguard, gre]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckRegistered([]string{"ipsec", "vxlan", "wireguard"}); err == nil || err.Error() != `cableDrivers[1]: "gre" is not a registered cable driver (have ipsec, vxlan, wireguard)` {
		t.Errorf("err = %v", err)
	}
	if err := c.CheckRegistered([]string{"gre", "wireguard"}); err != nil {
		t.Errorf("err = %v", err)
	}
}
