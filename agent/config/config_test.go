package config

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/drivers" // the real drivers validate their blocks
)

// issueExample is the documented example config, verbatim.
const issueExample = `cluster: east
node: east-gw1
broker: 10.0.0.1:7443
joinTokenFile: /etc/cablemesh/join-token
stateDir: /var/lib/cablemesh
gateway: true
advertiseAddress: 10.0.0.11
podCIDRs: [10.1.0.0/16]
statusSocket: /run/cablemesh/agent.sock
wireguard: {interface: cbl-wg0, port: 51820}
`

func TestTheIssueExampleDecodesWithDefaults(t *testing.T) {
	c, err := Parse([]byte(issueExample))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if c.Cluster != "east" || c.Node != "east-gw1" || c.Broker != "10.0.0.1:7443" || !c.Gateway {
		t.Errorf("identity fields wrong: %+v", c)
	}
	if c.JoinTokenFile != "/etc/cablemesh/join-token" || c.StateDir != "/var/lib/cablemesh" {
		t.Errorf("paths wrong: %+v", c)
	}
	if c.AdvertiseAddress != "10.0.0.11" || len(c.PodCIDRs) != 1 || c.PodCIDRs[0] != "10.1.0.0/16" {
		t.Errorf("addresses wrong: %+v", c)
	}
	if wg := c.Drivers["wireguard"]; !maps.Equal(wg, cable.Settings{"interface": "cbl-wg0", "port": "51820"}) {
		t.Errorf("wireguard = %v", wg)
	}
	if c.LeaseSeconds != 30 || c.HeartbeatInterval != 10*time.Second || c.ResyncInterval != 30*time.Second {
		t.Errorf("timing defaults wrong: lease %d heartbeat %s resync %s", c.LeaseSeconds, c.HeartbeatInterval, c.ResyncInterval)
	}
	if c.MetricsAddress != "" || c.LogLevel != "info" || c.StatusSocket != "/run/cablemesh/agent.sock" {
		t.Errorf("other defaults wrong: %+v", c)
	}
}

func TestEveryFieldDecodes(t *testing.T) {
	full := `cluster: west
node: west-gw1
broker: broker.example:7443
joinTokenFile: /tmp/tok
stateDir: /tmp/state
gateway: true
advertiseAddress: 192.168.1.5
podCIDRs: [10.2.0.0/16, 10.3.0.0/16]
serviceCIDRs: [10.96.0.0/12]
statusSocket: /tmp/agent.sock
wireguard:
  interface: cbl-west
  port: 51821
  mtu: 1380
leaseSeconds: 20
heartbeatInterval: 5s
resyncInterval: 1m
metricsAddress: 127.0.0.1:9400
logLevel: debug
policyDir: /etc/cablemesh/policies
`
	c, err := Parse([]byte(full))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !maps.Equal(c.Drivers["wireguard"], cable.Settings{"interface": "cbl-west", "port": "51821", "mtu": "1380"}) || c.LeaseSeconds != 20 ||
		c.HeartbeatInterval != 5*time.Second || c.ResyncInterval != time.Minute ||
		c.MetricsAddress != "127.0.0.1:9400" || c.LogLevel != "debug" || len(c.ServiceCIDRs) != 1 || c.PolicyDir != "/etc/cablemesh/policies" {
		t.Errorf("decoded %+v", c)
	}
}

func TestNodeDefaultsToTheHostName(t *testing.T) {
	old := hostname
	hostname = func() string { return "host-a" }
	t.Cleanup(func() { hostname = old })
	c, err := Parse([]byte("cluster: east\nbroker: b:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != "host-a" || c.Gateway {
		t.Errorf("node %q gateway %v", c.Node, c.Gateway)
	}
}

func TestNodeDefaultsToNodeNameFromTheEnvironment(t *testing.T) {
	// The DaemonSet sets NODE_NAME from the downward API: the kubelet's node name, which the agent
	// finds its Node object by, need not be the host name.
	t.Setenv(NodeNameEnv, "ip-10-0-3-7.eu-west-1.compute.internal")
	c, err := Parse([]byte("cluster: east\nbroker: b:1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != "ip-10-0-3-7.eu-west-1.compute.internal" {
		t.Errorf("node %q, want $NODE_NAME", c.Node)
	}
	c, err = Parse([]byte("cluster: east\nbroker: b:1\nnode: gw-1\n"))
	if err != nil || c.Node != "gw-1" {
		t.Errorf("an explicit node: %v, %v; want gw-1 over $NODE_NAME", c, err)
	}
}

func TestNodeNamesFollowTheBrokersRule(t *testing.T) {
	tests := []struct {
		name     string
		host     string
		yaml     string
		wantNode string
		wantErr  []string
	}{
		{name: "a host name in capitals becomes a lower-case node name, as the kubelet's", host: "Host-A", wantNode: "host-a"},
		{name: "a fully qualified host name with a trailing dot loses the dot", host: "gw1.example.org.", wantNode: "gw1.example.org"},
		{name: "a host name with an underscore is refused, naming it and asking for node", host: "GW_1",
			wantErr: []string{`node: "gw_1"`, `host name "GW_1"`, "not a valid node name", "set node:"}},
		{name: "an explicit node name in capitals is refused, not rewritten", host: "h", yaml: "node: GW_1\n",
			wantErr: []string{`node: "GW_1"`, "set in the agent config", "DNS subdomain"}},
		{name: "an explicit node name with an underscore is refused", host: "h", yaml: "node: gw_1\n",
			wantErr: []string{`node: "gw_1"`}},
		{name: "an explicit node name wins over the host name", host: "GW_1", yaml: "node: gw-1\n", wantNode: "gw-1"},
		{name: "no node name and no host name is refused", host: "", wantErr: []string{"node: is required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := hostname
			hostname = func() string { return tt.host }
			t.Cleanup(func() { hostname = old })
			c, err := Parse([]byte("cluster: east\nbroker: b:1\n" + tt.yaml))
			if len(tt.wantErr) == 0 {
				if err != nil || c.Node != tt.wantNode {
					t.Fatalf("node = %v, err = %v; want node %q", c, err, tt.wantNode)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse accepted node %q", c.Node)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestBadConfigsFailNamingTheField(t *testing.T) {
	base := "cluster: east\nnode: n1\nbroker: 10.0.0.1:7443\n"
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"an unknown top-level field is refused with its name and line", base + "gatway: true\n", []string{"line 4", `unknown field "gatway"`}},
		{"an unknown nested field is refused with its name and line", base + "wireguard:\n  iface: x\n", []string{"line 5", `unknown field "iface"`}},
		{"a bad CIDR names the list index and value", base + "podCIDRs: [10.0.0.0/16, 10.1.0.0/33]\n", []string{`podCIDRs[1]: "10.1.0.0/33" is not a CIDR`}},
		{"a CIDR with host bits names the value", base + "serviceCIDRs: [10.96.0.1/12]\n", []string{`serviceCIDRs[0]: "10.96.0.1/12"`, "10.96.0.0/12"}},
		{"a missing cluster is refused", "node: n1\nbroker: b:1\n", []string{"cluster: is required"}},
		{"a cluster that is not a DNS label is refused", "cluster: East_1\nbroker: b:1\n", []string{`cluster: "East_1"`}},
		{"a cluster name longer than 63 characters is refused", "cluster: " + strings.Repeat("a", 64) + "\nbroker: b:1\n", []string{"cluster:", "at most 63"}},
		{"an IPv4-mapped CIDR is refused as the broker refuses it", base + "podCIDRs: [\"::ffff:10.0.0.0/104\"]\n", []string{`podCIDRs[0]: "::ffff:10.0.0.0/104"`, "write it as IPv4"}},
		{"a missing broker is refused", "cluster: east\nnode: n\n", []string{"broker: is required"}},
		{"a broker without a port is refused", "cluster: east\nnode: n\nbroker: 10.0.0.1\n", []string{`broker: "10.0.0.1"`}},
		{"a broker list names the bad replica address", "cluster: east\nnode: n\nbroker: 10.0.0.1:7443,10.0.0.2\n", []string{`broker: "10.0.0.1:7443,10.0.0.2": "10.0.0.2"`, "host:port[,host:port...]"}},
		{"a gateway without advertiseAddress is refused", base + "gateway: true\n", []string{"advertiseAddress: is required"}},
		{"a bad advertiseAddress names the value", base + "advertiseAddress: 10.0.0.300\n", []string{`advertiseAddress: "10.0.0.300"`}},
		{"a port out of range names the value", base + "wireguard: {port: 70000}\n", []string{"wireguard.port: 70000"}},
		{"an interface name too long names the value", base + "wireguard: {interface: cbl-this-is-too-long}\n", []string{`wireguard.interface: "cbl-this-is-too-long"`}},
		{"an interface named .. is refused", base + "wireguard: {interface: \"..\"}\n", []string{`wireguard.interface: ".."`}},
		{"a bad mtu names the value", base + "wireguard: {mtu: 100}\n", []string{"wireguard.mtu: 100"}},
		{"a heartbeat not shorter than the lease is refused", base + "leaseSeconds: 10\nheartbeatInterval: 10s\n", []string{"heartbeatInterval", "leaseSeconds"}},
		{"a bare number for a duration is refused", base + "heartbeatInterval: 10\n", []string{"line 4", "10"}},
		{"a relative stateDir is refused", base + "stateDir: var/lib\n", []string{`stateDir: "var/lib"`}},
		{"a relative policyDir is refused", base + "policyDir: policies\n", []string{`policyDir: "policies"`, "absolute"}},
		{"a bad log level names the value", base + "logLevel: loud\n", []string{`logLevel: "loud"`}},
		{"a bad metrics address names the value", base + "metricsAddress: nope\n", []string{`metricsAddress: "nope"`}},
		{"a wrong type names the line", base + "gateway: maybe\n", []string{"line 4"}},
		{"an empty file is refused", "", []string{"empty"}},
		{"two documents are refused", base + "---\ncluster: west\n", []string{"more than one"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tt.yaml)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte("cluster: east\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), `"bogus"`) {
		t.Fatalf("Load error = %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(issueExample))
	f.Add([]byte("cluster: east\nbroker: b:1\npodCIDRs: [10.0.0.0/8]\nwireguard: {mtu: 1400}\n"))
	f.Add([]byte("heartbeatInterval: 5s\nleaseSeconds: 3\n"))
	f.Add([]byte("- a\n- b\n"))
	f.Add([]byte("&a [*a]"))
	f.Add([]byte("cluster: east\nbroker: b:1\nhealthCheck: {enabled: false, period: 1s, timeout: 1s, failureThreshold: 2, window: 8}\n"))
	f.Add([]byte("cluster: east\nbroker: b:1\nvxlan: &v {vni: 0x10, mtu: ~}\nipsec: *v\nwireguard: {interface: [a]}\n"))
	f.Add([]byte("cluster: east\nnode: Host-A\nbroker: b:1\ncableDrivers: [vxlan]\ngre: {}\n"))
	f.Add([]byte("cluster: east\nbroker: b:1\n" + servicesExample))
	f.Add([]byte("cluster: east\nbroker: b:1\ndns: {upstream: 10.0.0.1}\nimports: {selector: \"\"}\nexports: [{name: a, namespace: b, ports: [{port: -1}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if c != nil {
				t.Fatal("Parse returned a config with an error")
			}
			return
		}
		// Whatever Parse accepts must be valid and fully defaulted.
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
		if c.StateDir == "" || c.StatusSocket == "" || len(c.CableDrivers) == 0 || c.LeaseSeconds == 0 ||
			c.HealthCheck.Enabled == nil || c.HealthCheck.Timeout > c.HealthCheck.Period {
			t.Fatalf("accepted config lacks defaults: %+v", c)
		}
		if len(c.ExportsProto()) != len(c.Exports) || c.BPFPinDir == "" || c.DNS.TTL == 0 {
			t.Fatalf("accepted services fields do not all convert: %+v", c)
		}
		if len(Prefixes(c.PodCIDRs)) != len(c.PodCIDRs) {
			t.Fatalf("accepted podCIDRs do not all parse: %v", c.PodCIDRs)
		}
	})
}

func TestABrokerListOfReplicasIsAccepted(t *testing.T) {
	c, err := Parse([]byte("cluster: east\nnode: n1\nbroker: 10.0.0.1:7443, 10.0.0.2:7443\n"))
	if err != nil {
		t.Fatalf("a list of two replicas was refused: %v", err)
	}
	if c.Broker != "10.0.0.1:7443, 10.0.0.2:7443" {
		t.Errorf("broker %q", c.Broker)
	}
}
