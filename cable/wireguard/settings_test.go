package wireguard

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

func TestParseSettings(t *testing.T) {
	tests := []struct {
		name    string
		in      cable.Settings
		want    config
		wantErr []string // substrings the error must contain
	}{
		{name: "no settings give the defaults", in: nil,
			want: config{Interface: "cbl-wg0", Port: 51820, Keepalive: 25 * time.Second}},
		{name: "every key can be set", in: cable.Settings{"interface": "wg-x", "port": "4500", "mtu": "1380", "keepalive": "0s"},
			want: config{Interface: "wg-x", Port: 4500, MTU: 1380, Keepalive: 0}},
		{name: "MTU 0 is automatic", in: cable.Settings{"mtu": "0"},
			want: config{Interface: "cbl-wg0", Port: 51820, Keepalive: 25 * time.Second}},
		{name: "an unknown key is an error naming key and value and listing the known keys", in: cable.Settings{"listen": "1.2.3.4"},
			wantErr: []string{`wireguard.listen: "1.2.3.4" is refused: unknown field "listen"`, "known: interface, keepalive, mtu, port"}},
		{name: "a port that is not a number is an error", in: cable.Settings{"port": "http"},
			wantErr: []string{`wireguard.port: "http" is not a UDP port`}},
		{name: "port 0 is an error, not the default", in: cable.Settings{"port": "0"}, wantErr: []string{"wireguard.port: 0 is not a UDP port"}},
		{name: "port above 65535 is an error", in: cable.Settings{"port": "65536"}, wantErr: []string{"wireguard.port: 65536"}},
		{name: "port 70000 is an error", in: cable.Settings{"port": "70000"}, wantErr: []string{"wireguard.port: 70000"}},
		{name: "an MTU below the IPv6 minimum is an error", in: cable.Settings{"mtu": "1279"}, wantErr: []string{"wireguard.mtu: 1279 is out of range"}},
		{name: "an MTU of 100 is an error", in: cable.Settings{"mtu": "100"}, wantErr: []string{"wireguard.mtu: 100"}},
		{name: "an interface name longer than 15 bytes is an error", in: cable.Settings{"interface": "cbl-wireguard-000"},
			wantErr: []string{`wireguard.interface: "cbl-wireguard-000"`, "15"}},
		{name: "a much too long interface name is an error", in: cable.Settings{"interface": "cbl-this-is-too-long"},
			wantErr: []string{`wireguard.interface: "cbl-this-is-too-long"`}},
		{name: "an interface named .. is an error", in: cable.Settings{"interface": ".."}, wantErr: []string{`wireguard.interface: ".."`}},
		{name: "an interface name with a slash is an error", in: cable.Settings{"interface": "a/b"}, wantErr: []string{`wireguard.interface: "a/b"`}},
		{name: "an interface name with a space is an error", in: cable.Settings{"interface": "a b"}, wantErr: []string{`wireguard.interface: "a b"`}},
		{name: "an empty interface name is an error", in: cable.Settings{"interface": ""}, wantErr: []string{`wireguard.interface: ""`, "empty"}},
		{name: "a keepalive that is no duration is an error", in: cable.Settings{"keepalive": "25"}, wantErr: []string{"wireguard.keepalive: 25 "}},
		{name: "a keepalive with fractions of a second is an error", in: cable.Settings{"keepalive": "1500ms"}, wantErr: []string{`wireguard.keepalive: "1500ms"`, "whole seconds"}},
		{name: "a negative keepalive is an error", in: cable.Settings{"keepalive": "-5s"}, wantErr: []string{`wireguard.keepalive: "-5s"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSettings(tt.in)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("parseSettings(%v) = %+v, want an error", tt.in, got)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("parseSettings(%v): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("parseSettings(%v) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestNewRejectsBadSettingsThroughTheRegistry(t *testing.T) {
	_, err := cable.New("wireguard", cable.LocalNode{StateDir: t.TempDir()}, cable.Settings{"colour": "blue"})
	if err == nil || !strings.Contains(err.Error(), "colour") || !strings.Contains(err.Error(), "blue") {
		t.Fatalf("cable.New with an unknown key: err = %v, want one naming colour and blue", err)
	}
}

func TestDefaultMTU(t *testing.T) {
	tests := []struct {
		name     string
		underlay int
		want     int
	}{
		{"an Ethernet underlay gives 1420", 1500, 1420},
		{"a jumbo underlay gives its MTU minus 80", 9000, 8920},
		{"a small underlay is raised to 1280", 1300, 1280},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := defaultMTU(tt.underlay); got != tt.want {
				t.Errorf("defaultMTU(%d) = %d, want %d", tt.underlay, got, tt.want)
			}
		})
	}
}

func TestParseOptionsRejectsEveryKey(t *testing.T) {
	if err := parseOptions(nil); err != nil {
		t.Fatalf("no options: %v", err)
	}
	err := parseOptions(cable.Options{"cipher": "aes"})
	if err == nil || !strings.Contains(err.Error(), "cipher") || !strings.Contains(err.Error(), "aes") {
		t.Fatalf("parseOptions: err = %v, want one naming cipher and aes", err)
	}
}

func FuzzParseSettings(f *testing.F) {
	f.Add("interface", "cbl-wg0", "51820", "1420", "25s")
	f.Add("port", "x", "-1", "99999", "1.5s")
	f.Fuzz(func(t *testing.T, k, iface, port, mtu, ka string) {
		c, err := parseSettings(cable.Settings{k: iface, "port": port, "mtu": mtu, "keepalive": ka})
		if err != nil {
			return
		}
		if cable.CheckLinkName(c.Interface, cable.MaxLinkName) != nil || c.Port < 1 || c.Port > 65535 || c.MTU != 0 && c.MTU < MinMTU || c.Keepalive < 0 {
			t.Fatalf("parseSettings accepted an invalid config %+v", c)
		}
	})
}
