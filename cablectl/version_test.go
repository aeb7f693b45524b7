package cablectl

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/internal/version"
)

func TestVersionTablesMatchGolden(t *testing.T) {
	for _, tc := range []struct {
		golden     string
		v          versionInfo
		clientOnly bool
	}{
		{"version.golden", versionInfo{Client: "v1.4.0", Agent: "v1.4.0", Broker: "v1.3.2", BrokerAddress: "10.0.0.1:7443"}, false},
		{"version_unknown_broker.golden", versionInfo{Client: "v1.4.0", Agent: "v1.4.0", BrokerAddress: "10.0.0.1:7443"}, false},
		{"version_no_agent.golden", versionInfo{Client: "v1.4.0", AgentError: "cannot reach agent"}, false},
		{"version_client.golden", versionInfo{Client: "v1.4.0"}, true},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printVersion(&buf, "table", tc.v, tc.clientOnly); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, buf.Bytes())
		})
	}
}

func TestVersionCommand(t *testing.T) {
	s := fixtureStatus()
	s.Version, s.Broker.Version = "agent-build", "broker-build"
	sock := serveStatus(t, s)
	out, err := runCablectl("version", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v["client"] != version.String() || v["agent"] != "agent-build" || v["broker"] != "broker-build" || v["brokerAddress"] != "10.0.0.1:7443" {
		t.Errorf("version -o json = %v", v)
	}
	// Without an agent: the client's version still prints, and the exit code is 1.
	out, err = runCablectl("version", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if ExitCode(err) != 1 || !strings.HasPrefix(out, "Client: "+version.String()+"\n") || !strings.Contains(out, "Agent:  unknown (agent not reachable)") {
		t.Errorf("version without an agent: %v (exit %d)\n%s", err, ExitCode(err), out)
	}
	out, err = runCablectl("version", "--client", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if err != nil || out != "Client: "+version.String()+"\n" {
		t.Errorf("version --client: %v %q", err, out)
	}
}
