package ipsec

import (
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
		{name: "no settings give the defaults", in: nil,
			want: config{Port: 500, NATTPort: 4500, Charon: DefaultCharon, Datapath: DatapathAuto}},
		{name: "every setting is taken", in: cable.Settings{"port": "5000", "nattPort": "5001", "mtu": "1300", "charon": "/opt/sw/charon", "datapath": "libipsec"},
			want: config{Port: 5000, NATTPort: 5001, MTU: 1300, Charon: "/opt/sw/charon", Datapath: DatapathLibipsec}},
		{name: "MTU 0 is automatic and an empty system charon is none", in: cable.Settings{"mtu": "0", "useSystemCharon": "", "port": "500"},
			want: config{Port: 500, NATTPort: 4500, Charon: DefaultCharon, Datapath: DatapathAuto}},
		{name: "a system charon is a vici socket path and takes no defaults of our own charon", in: cable.Settings{"useSystemCharon": "/var/run/charon.vici"},
			want: config{SystemVICI: "/var/run/charon.vici"}},
		{name: "an unknown key is an error naming it and the known keys", in: cable.Settings{"interface": "x"},
			wantErr: `ipsec.interface: "x" is refused: unknown field "interface" (known: charon, datapath, mtu, nattPort, port, useSystemCharon)`},
		{name: "a port that is no number is refused", in: cable.Settings{"port": "ike"}, wantErr: `ipsec.port: "ike" is not a UDP port`},
		{name: "port zero is refused, not defaulted", in: cable.Settings{"nattPort": "0"}, wantErr: "ipsec.nattPort: 0 is not a UDP port"},
		{name: "equal IKE and NAT-T ports are refused", in: cable.Settings{"port": "4500"}, wantErr: "ipsec.nattPort: 4500 equals ipsec.port"},
		{name: "an MTU below the IPv6 minimum is refused", in: cable.Settings{"mtu": "1000"}, wantErr: "ipsec.mtu: 1000 is out of range (0 for automatic, or 1280..65535)"},
		{name: "a relative vici socket path is refused", in: cable.Settings{"useSystemCharon": "charon.vici"}, wantErr: `ipsec.useSystemCharon: "charon.vici" is not an absolute path`},
		{name: "an unknown datapath is refused", in: cable.Settings{"datapath": "xfrm"}, wantErr: `ipsec.datapath: "xfrm" is not auto, kernel or libipsec`},
		{name: "a port with a system charon is refused", in: cable.Settings{"useSystemCharon": "/run/charon.vici", "port": "500"}, wantErr: "ipsec.port: must be unset with ipsec.useSystemCharon"},
		{name: "a NAT-T port with a system charon is refused", in: cable.Settings{"useSystemCharon": "/run/charon.vici", "nattPort": "4500"}, wantErr: "ipsec.nattPort: must be unset with ipsec.useSystemCharon"},
		{name: "a charon binary with a system charon is refused", in: cable.Settings{"useSystemCharon": "/run/charon.vici", "charon": "/usr/lib/ipsec/charon"}, wantErr: "ipsec.charon: must be unset with ipsec.useSystemCharon"},
		{name: "a relative charon binary is refused", in: cable.Settings{"charon": "charon"}, wantErr: `ipsec.charon: "charon" is not an absolute path`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSettings(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name    string
		in      cable.Options
		want    options
		wantErr string
	}{
		{name: "no options give AES-GCM proposals and encapsulation", in: nil,
			want: options{IKEProposals: []string{DefaultIKEProposals}, ESPProposals: []string{DefaultESPProposals}, Encap: true}},
		{name: "proposal lists are split, trimmed and lower-cased", in: cable.Options{"ikeProposals": "AES128-SHA256-modp2048, aes256gcm16-prfsha384-ecp384", "espProposals": "aes128-sha256", "encap": "false"},
			want: options{IKEProposals: []string{"aes128-sha256-modp2048", "aes256gcm16-prfsha384-ecp384"}, ESPProposals: []string{"aes128-sha256"}, Encap: false}},
		{name: "an unknown key is an error naming it", in: cable.Options{"vni": "7"}, wantErr: `ipsec option vni="7": unknown key`},
		{name: "an empty proposal is refused", in: cable.Options{"espProposals": "aes128-sha256,"}, wantErr: `ipsec option espProposals="aes128-sha256,": empty proposal`},
		{name: "a proposal with a space inside is refused", in: cable.Options{"ikeProposals": "aes 128"}, wantErr: `proposal "aes 128" has the invalid character ' '`},
		{name: "a proposal cannot smuggle a second key", in: cable.Options{"ikeProposals": "aes128\nencap=no"}, wantErr: "invalid character"},
		{name: "encap that is no boolean is refused", in: cable.Options{"encap": "maybe"}, wantErr: `ipsec option encap="maybe": want true or false`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseOptions(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got.IKEProposals, "|") != strings.Join(tt.want.IKEProposals, "|") ||
				strings.Join(got.ESPProposals, "|") != strings.Join(tt.want.ESPProposals, "|") || got.Encap != tt.want.Encap {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzParseOptions: policy options are outside input. Whatever is accepted must be safe to put
// into a VICI message as proposals (only the proposal alphabet).
func FuzzParseOptions(f *testing.F) {
	f.Add("aes256gcm16-prfsha256-x25519", "aes128-sha256", "true")
	f.Add("", ",", "no")
	f.Add("aes\x00", "AES-GCM", "1")
	f.Fuzz(func(t *testing.T, ike, esp, encap string) {
		o, err := parseOptions(cable.Options{"ikeProposals": ike, "espProposals": esp, "encap": encap})
		if err != nil {
			return
		}
		for _, p := range append(o.IKEProposals, o.ESPProposals...) {
			if p == "" || strings.ContainsAny(p, " ,\n\r\t=\x00") {
				t.Fatalf("accepted proposal %q", p)
			}
		}
	})
}
