package deploy

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// unit reads a systemd unit into section -> key -> values (a key may repeat).
func unit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			out[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not key=value inside a section: %q", path, n, line)
			}
			out[section][k] = append(out[section][k], v)
		}
	}
	return out
}

func TestSystemdUnits(t *testing.T) {
	tests := []struct {
		name      string
		path      string
		wantExec  []string
		wantState string
	}{
		{"the broker keeps its data where cablectl looks for admin.yaml by default", "systemd/cable-broker.service",
			[]string{"/usr/local/bin/cable-broker", "--data-dir", "/var/lib/cablemesh/broker", "--listen"}, "cablemesh/broker"},
		{"the agent reads /etc/cablemesh/agent.yaml and keeps its state in /var/lib/cablemesh", "systemd/cable-agent.service",
			[]string{"/usr/local/bin/cable-agent", "--config", "/etc/cablemesh/agent.yaml"}, "cablemesh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := unit(t, tt.path)
			for _, s := range []string{"Unit", "Service", "Install"} {
				if u[s] == nil {
					t.Errorf("no [%s] section", s)
				}
			}
			exec := u["Service"]["ExecStart"]
			if len(exec) != 1 || !strings.HasPrefix(exec[0], strings.Join(tt.wantExec, " ")) {
				t.Errorf("ExecStart %q, want it to start with %q", exec, strings.Join(tt.wantExec, " "))
			}
			if got := u["Service"]["StateDirectory"]; len(got) != 1 || got[0] != tt.wantState {
				t.Errorf("StateDirectory %q, want %q", got, tt.wantState)
			}
			if got := u["Service"]["Restart"]; len(got) != 1 || got[0] != "always" {
				t.Errorf("Restart %q, want always", got)
			}
			if got := u["Install"]["WantedBy"]; len(got) != 1 || got[0] != "multi-user.target" {
				t.Errorf("WantedBy %q, want multi-user.target", got)
			}
		})
	}
}
