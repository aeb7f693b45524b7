package config

import (
	"slices"
	"strings"
	"testing"
)

const reloadBase = `cluster: x
node: x-gw
broker: 10.0.0.1:7443
gateway: true
advertiseAddress: 10.0.0.11
stateDir: /var/lib/cablemesh-x
cableDrivers: [vxlan, wireguard]
vxlan: {port: 4789, vni: 100}
wireguard: {interface: cbl-wgx, port: 51820}
healthCheck: {period: 1s}
exports:
- {name: web, namespace: shop, ports: [{port: 80}], endpoints: [{ip: 10.1.0.5}]}
`

func mustParse(t *testing.T, s string) *Config {
	t.Helper()
	c, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, s)
	}
	return c
}

func TestDiffSortsEveryChangeIntoLiveOrRefused(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		edit                       func(string) string
		refused                    []string
		drivers                    []string
		exports, health, dns, logs bool
		// liveOnly: a live change that needs no action (the new order of cableDrivers).
		liveOnly bool
	}{
		{name: "an identical file changes nothing", edit: func(s string) string { return s }},
		{name: "a comment or a reordering changes nothing", edit: func(s string) string { return "# new\n" + s }},
		{name: "a new vxlan port rebuilds vxlan alone",
			edit:    func(s string) string { return strings.Replace(s, "port: 4789", "port: 4790", 1) },
			drivers: []string{"vxlan"}},
		{name: "a wireguard block change rebuilds wireguard alone",
			edit:    func(s string) string { return strings.Replace(s, "port: 51820", "port: 51821", 1) },
			drivers: []string{"wireguard"}},
		{name: "a driver removed from cableDrivers is stopped",
			edit:    func(s string) string { return strings.Replace(s, "[vxlan, wireguard]", "[wireguard]", 1) },
			drivers: []string{"vxlan"}},
		{name: "reordering cableDrivers rebuilds nothing",
			edit:     func(s string) string { return strings.Replace(s, "[vxlan, wireguard]", "[wireguard, vxlan]", 1) },
			liveOnly: true},
		{name: "a new export re-syncs the exports",
			edit: func(s string) string {
				return s + "- {name: api, namespace: shop, ports: [{port: 8080}], endpoints: [{ip: 10.1.0.6}]}\n"
			},
			exports: true},
		{name: "a new probe period restarts the probers",
			edit:   func(s string) string { return strings.Replace(s, "period: 1s", "period: 2s", 1) },
			health: true},
		{name: "DNS upstreams and TTL are live",
			edit: func(s string) string { return s + "dns: {upstream: [10.0.0.53], ttl: 9}\n" },
			dns:  true},
		{name: "the log level is live",
			edit: func(s string) string { return s + "logLevel: debug\n" },
			logs: true},
		{name: "the cluster name is refused",
			edit:    func(s string) string { return strings.Replace(s, "cluster: x", "cluster: renamed", 1) },
			refused: []string{"cluster"}},
		{name: "the state dir and the status socket are refused",
			edit: func(s string) string {
				return strings.Replace(s, "stateDir: /var/lib/cablemesh-x", "stateDir: /srv/x\nstatusSocket: /run/x.sock", 1)
			},
			refused: []string{"stateDir", "statusSocket"}},
		{name: "turning probes off is live, with a period change in the same file",
			edit:   func(s string) string { return strings.Replace(s, "{period: 1s}", "{period: 2s, enabled: false}", 1) },
			health: true},
		{name: "the DNS listen address and the cgroup path are refused",
			edit:    func(s string) string { return s + "dns: {listen: 127.0.0.1:53}\ncgroupPath: /sys/fs/cgroup/x\n" },
			refused: []string{"cgroupPath", "dns.listen"}},
		{name: "an ingress setting is refused",
			edit:    func(s string) string { return s + "ingress: {sniPort: 16444}\n" },
			refused: []string{"ingress.sniPort"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := mustParse(t, reloadBase)
			next := mustParse(t, tc.edit(reloadBase))
			p := Diff(old, next)
			var refused []string
			for _, c := range p.Refused {
				refused = append(refused, c.Field)
				if c.Old == c.New {
					t.Errorf("refused %s shows the same old and new value %s", c.Field, c.Old)
				}
			}
			slices.Sort(refused)
			if !slices.Equal(refused, tc.refused) {
				t.Errorf("refused %v, want %v (plan %+v)", refused, tc.refused, p)
			}
			if !slices.Equal(p.Drivers, tc.drivers) {
				t.Errorf("drivers %v, want %v (plan %+v)", p.Drivers, tc.drivers, p)
			}
			if p.Exports != tc.exports || p.Health != tc.health || p.DNS != tc.dns || p.LogLevel != tc.logs {
				t.Errorf("exports/health/dns/log = %v/%v/%v/%v, want %v/%v/%v/%v", p.Exports, p.Health, p.DNS, p.LogLevel, tc.exports, tc.health, tc.dns, tc.logs)
			}
			empty := !tc.liveOnly && tc.refused == nil && tc.drivers == nil && !tc.exports && !tc.health && !tc.dns && !tc.logs
			if p.Empty() != empty {
				t.Errorf("Empty() = %v, want %v (plan %+v)", p.Empty(), empty, p)
			}
		})
	}
}

func TestRefusedMessageNamesTheFieldAndBothValues(t *testing.T) {
	old := mustParse(t, reloadBase)
	next := mustParse(t, strings.Replace(reloadBase, "cluster: x", "cluster: renamed", 1))
	p := Diff(old, next)
	if len(p.Refused) != 1 {
		t.Fatalf("refused %v", p.Refused)
	}
	msg := RefusedMessage(p.Refused[0])
	for _, want := range []string{"cluster", `"x"`, `"renamed"`, "restart"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %s", msg, want)
		}
	}
}

// Every field of Config is either live or refused: a field whose change Diff cannot see would be
// silently ignored by a running agent.
func TestDiffSeesEveryField(t *testing.T) {
	for _, field := range []string{"node", "broker", "gateway", "advertiseAddress", "podCIDRs", "serviceCIDRs",
		"leaseSeconds", "heartbeatInterval", "resyncInterval", "metricsAddress", "bpfPinDir", "kubernetes.enabled",
		"policyDir"} {
		found := false
		for _, p := range tagPaths(t) {
			if p == field {
				found = true
			}
		}
		if !found {
			t.Errorf("no config field %s", field)
		}
		if _, live := liveFields[field]; live {
			t.Errorf("%s is listed live, but the agent cannot apply it while it runs", field)
		}
	}
	for f := range liveFields {
		if !slices.Contains(tagPaths(t), f) {
			t.Errorf("live field %s is no config field", f)
		}
	}
}

func tagPaths(t *testing.T) []string {
	t.Helper()
	var out []Change
	// Diff of a zero config against a config whose every leaf differs lists every path.
	a, b := &Config{}, mustParse(t, reloadBase+`podCIDRs: [10.1.0.0/16]
serviceCIDRs: [10.2.0.0/16]
leaseSeconds: 40
metricsAddress: 127.0.0.1:9
bpfPinDir: /sys/fs/bpf/x
kubernetes: {enabled: true}
policyDir: /etc/p
imports: {selector: "a=b"}
dns: {listen: 127.0.0.1:53, upstream: [10.0.0.53], ttl: 9, allowClients: [192.0.2.0/24]}
logLevel: debug
joinTokenFile: /t
cgroupPath: /sys/fs/cgroup/x
`)
	p := Diff(a, b)
	out = append(out, p.Refused...)
	out = append(out, p.Live...)
	var paths []string
	for _, c := range out {
		paths = append(paths, c.Field)
	}
	return paths
}

func FuzzDiff(f *testing.F) {
	f.Add(reloadBase, strings.Replace(reloadBase, "port: 4789", "port: 4790", 1))
	f.Add(reloadBase, "cluster: y\nbroker: a:1\nnode: n\n")
	f.Fuzz(func(t *testing.T, a, b string) {
		old, err1 := Parse([]byte(a))
		next, err2 := Parse([]byte(b))
		if err1 != nil || err2 != nil {
			return
		}
		p := Diff(old, next)
		if same := Diff(old, old); !same.Empty() {
			t.Fatalf("a config differs from itself: %+v", same)
		}
		for _, c := range p.Refused {
			if _, live := liveFields[c.Field]; live {
				t.Fatalf("live field %s refused", c.Field)
			}
		}
	})
}
