package reload

import (
	"errors"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/config"
)

func TestErrorFieldNamesTheFieldOfAParseError(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"agent config /etc/a.yaml: healthCheck.period: \"1ms\" is out of range (100ms..1h)", "healthCheck.period"},
		{"agent config /x: cluster: \"Bad\": not a DNS label", "cluster"},
		{"agent config /x: line 3: unknown field \"foo\"", ""},
		{"agent config /x: line 4: vxlan.port: \"x\" is not a port", "vxlan.port"},
		{"agent config /x: exports[1].ports[0].port: 0 is not a port", "exports[1].ports[0].port"},
		{"agent config /x: config is empty", ""},
	} {
		if got := errorField(errors.New(tc.in)); got != tc.want {
			t.Errorf("errorField(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestOnlyEventsThatMayChangeTheConfigWakeTheReload(t *testing.T) {
	a := &Reloader{cfg: &config.Config{JoinTokenFile: "/etc/cablemesh/token/join-token"}, path: "/etc/cablemesh/agent.yaml"}
	for name, want := range map[string]bool{
		"/etc/cablemesh/agent.yaml":                  true,
		"/etc/cablemesh/..data":                      true, // a ConfigMap's symlink swap
		"/etc/cablemesh/..2026_11_23_22_00_00.12345": true,
		"/etc/cablemesh/token/join-token":            true,
		"/etc/cablemesh/agent.log":                   false,
		"/etc/cablemesh/agent.yaml.new":              false, // its rename over the file is the event
	} {
		if got := a.relevantEvent(name); got != want {
			t.Errorf("relevantEvent(%s) = %v, want %v", name, got, want)
		}
	}
}

func FuzzErrorField(f *testing.F) {
	f.Add("agent config /x: line 4: vxlan.port: \"x\" is not a port")
	f.Add("cluster: : : x[1]: ")
	f.Fuzz(func(t *testing.T, msg string) {
		field := errorField(errors.New(msg))
		if field != "" && !strings.Contains(msg, field+": ") {
			t.Fatalf("errorField(%q) = %q, which the message does not name", msg, field)
		}
	})
}
