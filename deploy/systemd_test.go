package deploy

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
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
		wantCaps  []string
	}{
		{"the broker keeps its data where cablectl looks for admin.yaml by default", "systemd/cable-broker.service",
			[]string{"/usr/local/bin/cable-broker", "--data-dir", "/var/lib/cablemesh/broker", "--listen"}, "cablemesh/broker", nil},
		{"the agent reads /etc/cablemesh/agent.yaml and keeps its state in /var/lib/cablemesh", "systemd/cable-agent.service",
			[]string{"/usr/local/bin/cable-agent", "--config", "/etc/cablemesh/agent.yaml"}, "cablemesh",
			[]string{"CAP_BPF", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_PERFMON", "CAP_SYS_ADMIN"}},
		{"Envoy runs the bootstrap the agent prints, with no capability", "systemd/cablemesh-envoy.service",
			[]string{"/usr/bin/envoy", "-c", "/run/cablemesh/envoy.yaml"}, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := unit(t, tt.path)
			for _, s := range []string{"Unit", "Service", "Install"} {
				if u[s] == nil {
					t.Errorf("no [%s] section", s)
				}
			}
			svc := u["Service"]
			exec := svc["ExecStart"]
			if len(exec) != 1 || !strings.HasPrefix(exec[0], strings.Join(tt.wantExec, " ")) {
				t.Errorf("ExecStart %q, want it to start with %q", exec, strings.Join(tt.wantExec, " "))
			}
			if tt.wantState != "" {
				if got := svc["StateDirectory"]; len(got) != 1 || got[0] != tt.wantState {
					t.Errorf("StateDirectory %q, want %q", got, tt.wantState)
				}
			}
			for k, want := range map[string]string{"Restart": "on-failure", "ProtectSystem": "strict", "PrivateTmp": "yes", "NoNewPrivileges": "yes", "ProtectHome": "yes"} {
				if got := svc[k]; len(got) != 1 || got[0] != want {
					t.Errorf("%s %q, want %s", k, got, want)
				}
			}
			for _, k := range []string{"CapabilityBoundingSet", "AmbientCapabilities"} {
				got := strings.Fields(strings.Join(svc[k], " "))
				slices.Sort(got)
				if len(svc[k]) != 1 || !slices.Equal(got, tt.wantCaps) {
					t.Errorf("%s %q, want exactly %q", k, got, tt.wantCaps)
				}
			}
			if got := u["Install"]["WantedBy"]; len(got) != 1 || got[0] != "multi-user.target" {
				t.Errorf("WantedBy %q, want multi-user.target", got)
			}
		})
	}
	t.Run("the agent may write its runtime and eBPF directories under ProtectSystem=strict", func(t *testing.T) {
		svc := unit(t, "systemd/cable-agent.service")["Service"]
		if rt := strings.Fields(strings.Join(svc["RuntimeDirectory"], " ")); !slices.Contains(rt, "cablemesh") || !slices.Contains(rt, "wireguard") {
			t.Errorf("RuntimeDirectory %q lacks cablemesh (status socket) or wireguard (UAPI dir)", rt)
		}
		if rw := svc["ReadWritePaths"]; !slices.Contains(rw, "-/sys/fs/bpf") {
			t.Errorf("ReadWritePaths %q lacks the bpffs the agent pins under", rw)
		}
	})
	t.Run("the envoy unit writes the bootstrap where it starts Envoy from", func(t *testing.T) {
		svc := unit(t, "systemd/cablemesh-envoy.service")["Service"]
		pre := strings.Join(svc["ExecStartPre"], " ")
		if !strings.Contains(pre, "cable-agent envoy-bootstrap --config /etc/cablemesh/agent.yaml > /run/cablemesh/envoy.yaml") {
			t.Errorf("ExecStartPre %q does not write Envoy's bootstrap to /run/cablemesh/envoy.yaml", pre)
		}
	})
}

// TestConfigSkeleton: the skeleton make install writes is refused as it is (nobody runs an agent
// for cluster "CLUSTER" by accident) and accepted once its upper-case values are filled in.
func TestConfigSkeleton(t *testing.T) {
	data, err := os.ReadFile("systemd/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse(data); err == nil || !strings.Contains(err.Error(), "CLUSTER") {
		t.Errorf("the unedited skeleton: %v, want an error naming cluster CLUSTER", err)
	}
	filled := strings.NewReplacer("CLUSTER", "east", "BROKER-HOST", "192.0.2.1", "THIS-NODE-IP", "192.0.2.10", "POD-CIDR", "10.1.0.0/16").Replace(string(data))
	cfg, err := config.Parse([]byte(filled))
	if err != nil {
		t.Fatalf("the filled-in skeleton: %v", err)
	}
	u := unit(t, "systemd/cable-agent.service")["Service"]
	if cfg.StateDir != "/var/lib/"+u["StateDirectory"][0] || !strings.HasPrefix(cfg.StatusSocket, "/run/cablemesh/") {
		t.Errorf("stateDir %s and statusSocket %s are not the unit's StateDirectory and RuntimeDirectory", cfg.StateDir, cfg.StatusSocket)
	}
}

// TestMakeInstall runs `make install DESTDIR=...` (binaries built into a private BIN) twice and
// checks what it laid down, that a config the operator edited survives, and, where
// systemd-analyze runs, that systemd accepts the installed units.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	dest, bin := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func() string {
		cmd := exec.CommandContext(ctx, "make", "-C", "..", "install", "DESTDIR="+dest, "BIN="+bin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make install: %v\n%s", err, out)
		}
		return string(out)
	}
	run()
	want := map[string]os.FileMode{
		"usr/local/bin/cable-agent":                  0o755,
		"usr/local/bin/cable-broker":                 0o755,
		"usr/local/bin/cablectl":                     0o755,
		"etc/systemd/system/cable-agent.service":     0o644,
		"etc/systemd/system/cable-broker.service":    0o644,
		"etc/systemd/system/cablemesh-envoy.service": 0o644,
		"etc/cablemesh/agent.yaml":                   0o600,
		"etc/cablemesh/policies":                     0o755 | os.ModeDir,
	}
	for p, mode := range want {
		st, err := os.Stat(filepath.Join(dest, p))
		if err != nil {
			t.Errorf("make install did not lay down %s: %v", p, err)
			continue
		}
		if st.Mode() != mode {
			t.Errorf("%s has mode %v, want %v", p, st.Mode(), mode)
		}
	}
	cfgPath := filepath.Join(dest, "etc/cablemesh/agent.yaml")
	edited := []byte("cluster: east # the operator's\n")
	if err := os.WriteFile(cfgPath, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := run(); !strings.Contains(out, "kept existing") {
		t.Errorf("a second make install did not say it kept the config:\n%s", out)
	}
	if got, _ := os.ReadFile(cfgPath); !bytes.Equal(got, edited) {
		t.Errorf("make install overwrote an existing config: %q", got)
	}

	t.Run("systemd-analyze verify accepts the installed units", func(t *testing.T) {
		sa, err := exec.LookPath("systemd-analyze")
		if err != nil {
			t.Skip("systemd-analyze is not installed")
		}
		// verify checks that ExecStart's binaries exist: point the units at the installed ones
		// (and Envoy's at a stand-in, Envoy is not part of the install).
		dir := t.TempDir()
		envoy := filepath.Join(dir, "envoy")
		if err := os.WriteFile(envoy, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		var units []string
		for _, u := range []string{"cable-agent.service", "cable-broker.service", "cablemesh-envoy.service"} {
			data, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system", u))
			if err != nil {
				t.Fatal(err)
			}
			data = bytes.ReplaceAll(data, []byte("/usr/local/bin/"), []byte(filepath.Join(dest, "usr/local/bin")+"/"))
			data = bytes.ReplaceAll(data, []byte("/usr/bin/envoy"), []byte(envoy))
			p := filepath.Join(dir, u)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			units = append(units, p)
		}
		cmd := exec.CommandContext(ctx, sa, append([]string{"verify"}, units...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err = cmd.Run()
		msg := stderr.String()
		if err != nil && strings.Contains(msg, "Failed to initialize manager") || strings.Contains(msg, "System has not been booted with systemd") {
			t.Skipf("systemd-analyze cannot run here: %s", msg)
		}
		// verify exits 0 on unknown keys and bad values ("ignoring"): any line about our units fails.
		var bad []string
		for _, l := range strings.Split(msg, "\n") {
			if strings.Contains(l, ".service") {
				bad = append(bad, l)
			}
		}
		if err != nil || len(bad) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(bad, "\n"))
		}
	})
}
