package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBadInvocationsExitTwoBeforeCreatingAnything(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	sock := filepath.Join(dir, "agent.sock")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "cluster: east\nnode: e1\nbroker: 127.0.0.1:1\nstateDir: " + state + "\nstatusSocket: " + sock + "\n"
	gw := "gateway: true\nadvertiseAddress: 127.0.0.1\n"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no --config is bad usage", nil, "usage"},
		{"an unknown flag is bad usage", []string{"--confg", "x"}, "flag provided but not defined"},
		{"a missing config file is reported", []string{"--config", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"an unknown config field is reported with its line", []string{"--config", write("a.yaml", good+"gatewy: true\n")}, `line 6: unknown field "gatewy"`},
		{"a bad CIDR is reported with the field", []string{"--config", write("b.yaml", good+"podCIDRs: [10.0.0.0/40]\n")}, `podCIDRs[0]: "10.0.0.0/40" is not a CIDR`},
		{"a bad --log-level is reported", []string{"--config", write("c.yaml", good), "--log-level", "loud"}, `logLevel: "loud"`},
		{"an unregistered cable driver is reported", []string{"--config", write("d.yaml", good+gw+"cableDrivers: [wireguard, gre]\n")},
			`cableDrivers[1]: "gre" is not a registered cable driver (have ipsec, vxlan, vxlan+ipsec, wireguard)`},
		{"a VNI out of range is reported with the field", []string{"--config", write("e.yaml", good+gw+"vxlan: {vni: 0x1000000}\n")}, "vxlan.vni: 16777216 is out of range"},
		{"an ipsec port with a system charon is reported", []string{"--config", write("f.yaml", good+gw+"ipsec: {useSystemCharon: /run/charon.vici, nattPort: 4500}\n")},
			"ipsec.nattPort: must be unset with ipsec.useSystemCharon"},
		{"a node name the broker would refuse is reported with the field", []string{"--config", write("g.yaml", strings.Replace(good, "node: e1", "node: GW_1", 1))},
			`node: "GW_1", set in the agent config, is not a valid node name`},
		{"a driver block that is not a mapping is reported with its line", []string{"--config", write("h.yaml", good+gw+"wireguard: [wg0]\n")},
			"line 8: wireguard: want a mapping"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tt.args, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2 (stderr: %s)", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tt.want)
			}
			for _, p := range []string{state, sock} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("%s was created", p)
				}
			}
		})
	}
}

// TestBadFilesOnFirstStartExitTwoBeforeCreatingAnything: a stateDir that is
// a file, and a join token file that is missing or unreadable when the node has not joined yet,
// are bad config: exit 2, naming the field and the path, before anything is created.
func TestBadFilesOnFirstStartExitTwoBeforeCreatingAnything(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	aFile := filepath.Join(dir, "a-file")
	if err := os.WriteFile(aFile, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	aDir := filepath.Join(dir, "a-dir")
	if err := os.Mkdir(aDir, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	config := func(stateDir, tokenFile string) string {
		body := "cluster: east\nnode: e1\nbroker: 127.0.0.1:1\nstateDir: " + stateDir + "\nstatusSocket: " + sock + "\n"
		if tokenFile != "" {
			body += "joinTokenFile: " + tokenFile + "\n"
		}
		p := filepath.Join(dir, "agent.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, stateDir, tokenFile string
		want                      []string
	}{
		{"a stateDir that is a file", aFile, token, []string{"stateDir", aFile, "not a directory"}},
		{"a stateDir below a file", filepath.Join(aFile, "state"), token, []string{"stateDir", aFile, "not a directory"}},
		{"a missing join token file", state, filepath.Join(dir, "missing-token"), []string{"joinTokenFile", filepath.Join(dir, "missing-token"), "no such file"}},
		{"a join token file that cannot be read", state, aDir, []string{"joinTokenFile", aDir, "is a directory"}},
		{"no join token file and no certificate", state, "", []string{"joinTokenFile", "required", state}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run([]string{"--config", config(tt.stateDir, tt.tokenFile)}, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2 (stderr: %s)", code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q does not contain %q", stderr.String(), w)
				}
			}
			for _, p := range []string{state, sock} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("%s was created", p)
				}
			}
			t.Logf("stderr: %s", strings.TrimSpace(stderr.String()))
		})
	}
}

// TestAWireGuardPortOfZeroIsRefused (defect 5): port 0 is not "the default".
func TestAWireGuardPortOfZeroIsRefused(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "agent.yaml")
	body := "cluster: east\nnode: e1\nbroker: 127.0.0.1:1\nstateDir: " + filepath.Join(dir, "state") + "\nstatusSocket: " + filepath.Join(dir, "s.sock") +
		"\ngateway: true\nadvertiseAddress: 127.0.0.1\nwireguard: {port: 0}\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := run([]string{"--config", p}, &stderr); code != 2 || !strings.Contains(stderr.String(), "wireguard.port: 0") {
		t.Errorf("exit code %d, stderr %q; want 2 naming wireguard.port: 0", code, stderr.String())
	}
	t.Logf("stderr: %s", strings.TrimSpace(stderr.String()))
}
