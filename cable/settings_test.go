package cable

import (
	"errors"
	"strings"
	"testing"
)

func TestSettingErrorsReadTheSameForEveryDriver(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"a number is printed bare", BadSetting("vxlan", "vni", "16777216", "is out of range (1..%d)", 1<<24-1),
			"vxlan.vni: 16777216 is out of range (1..16777215)"},
		{"text is quoted", BadSetting("ipsec", "charon", "charon", "is not an absolute path"), `ipsec.charon: "charon" is not an absolute path`},
		{"a number with a sign or leading zeros is text as written", BadSetting("vxlan", "port", "+4789", "x"), `vxlan.port: "+4789" x`},
		{"an error about the key alone has no value", &SettingError{Driver: "ipsec", Key: "port", NoValue: true, Reason: "must be unset with ipsec.useSystemCharon"},
			"ipsec.port: must be unset with ipsec.useSystemCharon"},
		{"an unknown key lists the known ones in order", UnknownSetting("wireguard", "listen", "1.2.3.4", "port", "interface"),
			`wireguard.listen: "1.2.3.4" is refused: unknown field "listen" (known: interface, port)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("error %q, want %q", got, tt.want)
			}
			var se *SettingError
			if !errors.As(tt.err, &se) {
				t.Errorf("%v is not a *SettingError", tt.err)
			}
		})
	}
}

func TestNumericSettings(t *testing.T) {
	tests := []struct {
		name    string
		parse   func(string) (int, error)
		in      string
		want    int
		wantErr string
	}{
		{"a port is taken", func(v string) (int, error) { return PortSetting("d", "port", v) }, "4500", 4500, ""},
		{"port 0 is refused, not defaulted", func(v string) (int, error) { return PortSetting("d", "port", v) }, "0", 0, "d.port: 0 is not a UDP port (1..65535)"},
		{"a port above 65535 is refused", func(v string) (int, error) { return PortSetting("d", "port", v) }, "70000", 0, "d.port: 70000 is not a UDP port"},
		{"a port that is no number is refused", func(v string) (int, error) { return PortSetting("d", "port", v) }, "http", 0, `d.port: "http" is not a UDP port`},
		{"MTU 0 is automatic", func(v string) (int, error) { return MTUSetting("d", "mtu", v, 1280, 65535) }, "0", 0, ""},
		{"an MTU in range is taken", func(v string) (int, error) { return MTUSetting("d", "mtu", v, 1280, 65535) }, "1400", 1400, ""},
		{"an MTU below the range is refused", func(v string) (int, error) { return MTUSetting("d", "mtu", v, 1280, 65535) }, "1000", 0,
			"d.mtu: 1000 is out of range (0 for automatic, or 1280..65535)"},
		{"an integer out of range is refused", func(v string) (int, error) { return IntSetting("d", "vni", v, 1, 9) }, "10", 0, "d.vni: 10 is out of range (1..9)"},
		{"an integer with leading zeros is refused", func(v string) (int, error) { return IntSetting("d", "vni", v, 1, 9) }, "05", 0, `d.vni: "05" is not a decimal integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestCheckLinkName(t *testing.T) {
	tests := []struct {
		name, in string
		max      int
		want     string
	}{
		{"a usual name is valid", "cbl-wg0", MaxLinkName, ""},
		{"an empty name is refused", "", MaxLinkName, "is empty"},
		{"a name longer than the kernel takes is refused", "cbl-this-is-too-long", MaxLinkName, "is 20 bytes, at most 15 fit"},
		{"a shorter limit applies to prefixes", "cbl-vxl", 6, "is 7 bytes, at most 6 fit"},
		{"dot-dot is refused", "..", MaxLinkName, "reserved"},
		{"a slash is refused", "a/b", MaxLinkName, "invalid character '/'"},
		{"a space is refused", "a b", MaxLinkName, "invalid character ' '"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckLinkName(tt.in, tt.max)
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckLinkName(%q) = %v, want %q", tt.in, err, tt.want)
			}
		})
	}
}
