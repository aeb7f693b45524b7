package vxlanipsec

import (
	"errors"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

func TestSettingsDefaultsSplitIntoTheTwoDrivers(t *testing.T) {
	c, err := parseSettings(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.VXLANPort != DefaultVXLANPort || c.VXLAN["port"] != "4799" || c.VXLAN["interfacePrefix"] != "cbl-vi" || c.VXLAN["vni"] != "100" {
		t.Errorf("vxlan half %d %v", c.VXLANPort, c.VXLAN)
	}
	if c.IPsec["port"] != "4510" || c.IPsec["nattPort"] != "4511" || c.IPsec["datapath"] != "kernel" {
		t.Errorf("ipsec half %v", c.IPsec)
	}
	c, err = parseSettings(cable.Settings{"vxlanPort": "4800", "vni": "7", "mtu": "1400", "interfacePrefix": "cbl-x", "ikePort": "600", "nattPort": "4600", "charon": "/opt/charon"})
	if err != nil {
		t.Fatal(err)
	}
	if c.VXLANPort != 4800 || c.VXLAN["vni"] != "7" || c.VXLAN["mtu"] != "1400" || c.IPsec["port"] != "600" || c.IPsec["charon"] != "/opt/charon" {
		t.Errorf("settings did not reach the halves: %+v", c)
	}
}

func TestBadSettingsNameThisDriversKeyAndValue(t *testing.T) {
	tests := []struct {
		name string
		s    cable.Settings
		want string
	}{
		{"a VXLAN port out of range", cable.Settings{"vxlanPort": "70000"}, "vxlan+ipsec.vxlanPort: 70000 is out of range (1..65534)"},
		{"the last port cannot be pinned", cable.Settings{"vxlanPort": "65535"}, "vxlan+ipsec.vxlanPort: 65535 is out of range"},
		{"a VNI out of range", cable.Settings{"vni": "0"}, "vxlan+ipsec.vni: 0 is out of range"},
		{"an MTU too small", cable.Settings{"mtu": "100"}, "vxlan+ipsec.mtu: 100 is out of range"},
		{"a prefix too long", cable.Settings{"interfacePrefix": "cbl-vxi1"}, `vxlan+ipsec.interfacePrefix: "cbl-vxi1" is 8 bytes`},
		{"the vxlan driver's prefix", cable.Settings{"interfacePrefix": "cbl-vx"}, `vxlan+ipsec.interfacePrefix: "cbl-vx" overlaps the vxlan driver's link prefix`},
		{"a shorter prefix of the vxlan driver's", cable.Settings{"interfacePrefix": "cbl-"}, `vxlan+ipsec.interfacePrefix: "cbl-" overlaps`},
		{"a prefix with a slash", cable.Settings{"interfacePrefix": "a/b"}, `vxlan+ipsec.interfacePrefix: "a/b" has the invalid character '/'`},
		{"an IKE port that is no port", cable.Settings{"ikePort": "x"}, `vxlan+ipsec.ikePort: "x" is not a UDP port`},
		{"equal IKE ports", cable.Settings{"ikePort": "4511"}, "vxlan+ipsec.nattPort: 4511 equals vxlan+ipsec.ikePort"},
		{"the VXLAN port on an IKE port", cable.Settings{"vxlanPort": "4510"}, "vxlan+ipsec.vxlanPort: 4510 is also an IKE port"},
		{"a relative charon", cable.Settings{"charon": "charon"}, `vxlan+ipsec.charon: "charon" is not an absolute path`},
		{"an unknown key", cable.Settings{"port": "1"}, `vxlan+ipsec.port: 1 is refused: unknown field "port" (known: charon, ikePort, interfacePrefix, mtu, nattPort, vni, vxlanPort)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseSettings(tt.s)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v: err = %v, want it to contain %q", tt.s, err, tt.want)
			}
			var se *cable.SettingError
			if !errors.As(err, &se) || se.Driver != Name {
				t.Errorf("err %v is not a *cable.SettingError of %s", err, Name)
			}
		})
	}
}

func TestOptionsSplitAndRefuseWhatTheMTUCannotCarry(t *testing.T) {
	p, err := parseOptions(cable.Options{"vni": "5", "mtu": "1300", "espProposals": "aes128gcm16-x25519,chacha20poly1305", "ikeProposals": "aes128-sha256-x25519"})
	if err != nil {
		t.Fatal(err)
	}
	if p.VXLAN["vni"] != "5" || p.VXLAN["mtu"] != "1300" || p.IPsec["espProposals"] == "" || p.IPsec["ikeProposals"] == "" {
		t.Errorf("options did not reach the halves: %+v", p)
	}
	for _, tt := range []struct {
		o    cable.Options
		want string
	}{
		{cable.Options{"espProposals": "aes256-sha256"}, `vxlan+ipsec option espProposals="aes256-sha256": proposal "aes256-sha256" is not AEAD`},
		{cable.Options{"espProposals": "aes128gcm16,"}, `proposal "" is not AEAD`},
		{cable.Options{"encap": "true"}, `vxlan+ipsec option encap="true": unknown key`},
		{cable.Options{"port": "4789"}, `vxlan+ipsec option port="4789": unknown key`},
		{cable.Options{"vni": "0"}, `vxlan+ipsec: vxlan option vni="0"`},
		{cable.Options{"ikeProposals": "aes/1"}, `vxlan+ipsec: ipsec option ikeProposals="aes/1"`},
	} {
		if _, err := parseOptions(tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want it to contain %q", tt.o, err, tt.want)
		}
	}
}

func TestPublishedVXLANPortIsChecked(t *testing.T) {
	if p, err := remoteVXLANPort(map[string]string{"vxlanPort": "4799"}); err != nil || p != 4799 {
		t.Errorf("4799: %d %v", p, err)
	}
	for _, attrs := range []map[string]string{nil, {"vxlanPort": ""}, {"vxlanPort": "04799"}, {"vxlanPort": "65535"}, {"vxlanPort": "-1"}} {
		if err := checkPublished(attrs); err == nil {
			t.Errorf("%v accepted", attrs)
		}
	}
}

// FuzzSettings: no block, however malformed, panics the parser, and what it accepts is
// accepted by the two embedded drivers too.
func FuzzSettings(f *testing.F) {
	f.Add("vxlanPort", "4799", "ikePort", "4510")
	f.Add("interfacePrefix", "cbl-vi", "mtu", "0")
	f.Add("nattPort", "4510", "charon", "/x")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		c, err := parseSettings(cable.Settings{k1: v1, k2: v2})
		if err != nil {
			return
		}
		if err := cable.ParseSettings("vxlan", c.VXLAN); err != nil {
			t.Errorf("accepted %s=%q %s=%q, but the vxlan half fails: %v", k1, v1, k2, v2, err)
		}
		if err := cable.ParseSettings("ipsec", c.IPsec); err != nil {
			t.Errorf("accepted %s=%q %s=%q, but the ipsec half fails: %v", k1, v1, k2, v2, err)
		}
	})
}

// FuzzOptions: options and published attributes never panic their parsers.
func FuzzOptions(f *testing.F) {
	f.Add("espProposals", "aes256gcm16-x25519")
	f.Add("vni", "100")
	f.Add("vxlanPort", "4799")
	f.Fuzz(func(t *testing.T, k, v string) {
		_, _ = parseOptions(cable.Options{k: v})
		_ = checkPublished(map[string]string{k: v})
	})
}
