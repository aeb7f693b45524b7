package drivers

import (
	"errors"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// TestSettingsErrorsReadAsOperatorsSeeThem: the agent config hands each driver its raw block and
// shows its error as is, so every driver reports "<driver>.<key>: <value> <reason>" (the agent
// config's tests hold the same texts).
func TestSettingsErrorsReadAsOperatorsSeeThem(t *testing.T) {
	tests := []struct {
		driver   string
		settings cable.Settings
		want     string
	}{
		{"wireguard", cable.Settings{"port": "70000"}, "wireguard.port: 70000"},
		{"wireguard", cable.Settings{"port": "0"}, "wireguard.port: 0 is not a UDP port"},
		{"wireguard", cable.Settings{"interface": "cbl-this-is-too-long"}, `wireguard.interface: "cbl-this-is-too-long"`},
		{"wireguard", cable.Settings{"interface": ".."}, `wireguard.interface: ".."`},
		{"wireguard", cable.Settings{"mtu": "100"}, "wireguard.mtu: 100"},
		{"wireguard", cable.Settings{"listen": "x"}, `wireguard.listen: "x" is refused: unknown field "listen" (known: interface, keepalive, mtu, port)`},
		{"vxlan", cable.Settings{"vni": "16777216"}, "vxlan.vni: 16777216 is out of range"},
		{"vxlan", cable.Settings{"port": "70000"}, "vxlan.port: 70000 is not a UDP port"},
		{"vxlan", cable.Settings{"mtu": "500"}, "vxlan.mtu: 500 is out of range"},
		{"vxlan", cable.Settings{"vnid": "3"}, `vxlan.vnid: 3 is refused: unknown field "vnid" (known: interfacePrefix, mtu, port, vni)`},
		{"ipsec", cable.Settings{"port": "4500"}, "ipsec.nattPort: 4500 equals ipsec.port"},
		{"ipsec", cable.Settings{"charon": "charon"}, `ipsec.charon: "charon" is not an absolute path`},
		{"ipsec", cable.Settings{"useSystemCharon": "charon.vici"}, `ipsec.useSystemCharon: "charon.vici" is not an absolute path`},
		{"ipsec", cable.Settings{"useSystemCharon": "/run/charon.vici", "port": "500"}, "ipsec.port: must be unset with ipsec.useSystemCharon"},
		{"ipsec", cable.Settings{"useSystemCharon": "/run/charon.vici", "nattPort": "4500"}, "ipsec.nattPort: must be unset with ipsec.useSystemCharon"},
		{"ipsec", cable.Settings{"mtu": "1000"}, "ipsec.mtu: 1000 is out of range"},
		{"vxlan+ipsec", cable.Settings{"vxlanPort": "65535"}, "vxlan+ipsec.vxlanPort: 65535 is out of range (1..65534)"},
		{"vxlan+ipsec", cable.Settings{"ikePort": "4511"}, "vxlan+ipsec.nattPort: 4511 equals vxlan+ipsec.ikePort"},
		{"vxlan+ipsec", cable.Settings{"interfacePrefix": "cbl-vx"}, `vxlan+ipsec.interfacePrefix: "cbl-vx" overlaps the vxlan driver's link prefix`},
		{"vxlan+ipsec", cable.Settings{"mtu": "100"}, "vxlan+ipsec.mtu: 100 is out of range"},
		{"vxlan+ipsec", cable.Settings{"charon": "charon"}, `vxlan+ipsec.charon: "charon" is not an absolute path`},
		{"vxlan+ipsec", cable.Settings{"port": "4799"}, `vxlan+ipsec.port: 4799 is refused: unknown field "port" (known: charon, ikePort, interfacePrefix, mtu, nattPort, vni, vxlanPort)`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			err := cable.ParseSettings(tt.driver, tt.settings)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%s settings %v: err = %v, want it to contain %q", tt.driver, tt.settings, err, tt.want)
			}
			var se *cable.SettingError
			if !errors.As(err, &se) || se.Driver != tt.driver {
				t.Errorf("err %v is not a *cable.SettingError of %s", err, tt.driver)
			}
		})
	}
}

// TestTheIssue3ExampleBlocksAreAccepted: the blocks of the documented agent config, with their
// zeros and empty strings meaning "automatic" and "unset".
func TestTheIssue3ExampleBlocksAreAccepted(t *testing.T) {
	for driver, s := range map[string]cable.Settings{
		"wireguard": {"interface": "cbl-wg0", "port": "51820", "mtu": "0"},
		"vxlan":     {"port": "4789", "vni": "100", "mtu": "0"},
		"ipsec":     {"port": "500", "nattPort": "4500", "mtu": "0", "charon": "/usr/lib/ipsec/charon", "useSystemCharon": ""},
		"vxlan+ipsec": {"vxlanPort": "4799", "vni": "100", "mtu": "0", "interfacePrefix": "cbl-vi", "ikePort": "4510", "nattPort": "4511",
			"charon": "/usr/lib/ipsec/charon"},
	} {
		if err := cable.ParseSettings(driver, s); err != nil {
			t.Errorf("%s %v: %v", driver, s, err)
		}
	}
}
