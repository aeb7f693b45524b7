package policy

import (
	"maps"
	"strings"
	"testing"
)

func TestGatewayModeOption(t *testing.T) {
	tests := []struct {
		name string
		opts map[string]string
		want bool
	}{
		{"nil options are direct", nil, false},
		{"no mode is direct", map[string]string{"vni": "100"}, false},
		{"mode gateway is gateway", map[string]string{"mode": "gateway"}, true},
		{"mode direct is direct", map[string]string{"mode": "direct"}, false},
		{"a differently spelled mode is not gateway", map[string]string{"mode": "Gateway"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := GatewayModeOption(tt.opts); got != tt.want {
				t.Errorf("GatewayModeOption(%v) = %v, want %v", tt.opts, got, tt.want)
			}
		})
	}
}

func TestDriverOptionsDropsModeAndCopies(t *testing.T) {
	if got := DriverOptions(nil); got != nil {
		t.Errorf("DriverOptions(nil) = %v, want nil", got)
	}
	in := map[string]string{"mode": "gateway", "vni": "100"}
	got := DriverOptions(in)
	if want := map[string]string{"vni": "100"}; !maps.Equal(got, want) {
		t.Errorf("DriverOptions = %v, want %v", got, want)
	}
	if in["mode"] != "gateway" {
		t.Errorf("DriverOptions changed its input: %v", in)
	}
	got["vni"] = "7"
	if in["vni"] != "100" {
		t.Errorf("DriverOptions returned the input map, not a copy")
	}
	if got := DriverOptions(map[string]string{"mode": "direct"}); got == nil || len(got) != 0 {
		t.Errorf("DriverOptions of only a mode = %v, want an empty non-nil map", got)
	}
}

func TestValidateMode(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // "" = valid
	}{
		{"gateway is accepted", "spec:\n  cableDriver:\n    name: wireguard\n    options: {mode: gateway}\n", ""},
		{"direct is accepted", "spec:\n  cableDriver:\n    name: wireguard\n    options: {mode: direct}\n", ""},
		{"another mode is refused naming the field and value", "spec:\n  cableDriver:\n    name: wireguard\n    options: {mode: bridge}\n",
			`spec.cableDriver.options.mode: "bridge" is not gateway or direct`},
		{"an empty mode is refused", "spec:\n  cableDriver:\n    name: wireguard\n    options: {mode: \"\"}\n",
			`spec.cableDriver.options.mode: "" is not gateway or direct`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeYAML([]byte(head + tt.in))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("DecodeYAML: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("DecodeYAML error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
