package config

import (
	"strings"
	"testing"
)

const servicesExample = `dns: {listen: "10.1.0.1:53", upstream: [10.96.0.10, "10.96.0.11:5353", /etc/resolv.conf], ttl: 10}
cgroupPath: /sys/fs/cgroup/unified
bpfPinDir: /sys/fs/bpf/cm-east
imports: {selector: "cablemesh.io/exported=true,env!=dev"}
exports:
- name: web
  namespace: shop
  labels: {tier: front}
  affinity: none
  ports: [{name: http, port: 80, protocol: tcp}]
  endpoints: [{ip: 10.1.0.10}, {ip: 10.1.0.11, hostname: web-1, ready: false}]
- {name: db, namespace: shop, type: Headless, endpoints: [{ip: 10.1.0.20, hostname: db-0}]}
kubernetes: {enabled: true}
`

func TestServicesFieldsDecodeWithDefaults(t *testing.T) {
	base := "cluster: east\nnode: n1\nbroker: 10.0.0.1:7443\n"
	t.Run("without services fields the defaults apply", func(t *testing.T) {
		c, err := Parse([]byte(base))
		if err != nil {
			t.Fatal(err)
		}
		if c.DNS.Listen != "" || c.DNS.TTL != 5 || c.CgroupPath != "" || c.BPFPinDir != "/sys/fs/bpf/cablemesh" ||
			c.Imports.Selector != nil || c.Imports.EffectiveSelector() != "cablemesh.io/exported=true" || len(c.Exports) != 0 || c.Kubernetes.Enabled {
			t.Errorf("defaults %+v", c)
		}
	})
	t.Run("every services field is read", func(t *testing.T) {
		c, err := Parse([]byte(base + servicesExample))
		if err != nil {
			t.Fatal(err)
		}
		if c.DNS.Listen != "10.1.0.1:53" || len(c.DNS.Upstream) != 3 || c.DNS.TTL != 10 || c.CgroupPath != "/sys/fs/cgroup/unified" ||
			c.BPFPinDir != "/sys/fs/bpf/cm-east" || c.Imports.EffectiveSelector() != "cablemesh.io/exported=true,env!=dev" || !c.Kubernetes.Enabled {
			t.Errorf("fields %+v", c)
		}
		ex := c.ExportsProto()
		if len(ex) != 2 {
			t.Fatalf("exports %v", ex)
		}
		web := ex[0] // normalised exports keep the file's order
		if web.Type != "ClusterSetIP" || web.Affinity != "none" || web.Ports[0].Protocol != "TCP" || web.Labels["tier"] != "front" ||
			web.Labels["cablemesh.io/exported"] != "true" || !web.Endpoints[0].Ready || web.Endpoints[1].Ready || web.Endpoints[1].Hostname != "web-1" {
			t.Errorf("web %+v", web)
		}
	})
	t.Run("one upstream may be a plain string", func(t *testing.T) {
		c, err := Parse([]byte(base + "dns: {listen: \"127.0.0.1:53\", upstream: 10.0.0.2}\n"))
		if err != nil || len(c.DNS.Upstream) != 1 || c.DNS.Upstream[0] != "10.0.0.2" {
			t.Errorf("upstream %v %v", c, err)
		}
	})
	t.Run("an empty selector is kept apart from an unset one: it imports nothing", func(t *testing.T) {
		c, err := Parse([]byte(base + "imports: {selector: \"\"}\n"))
		if err != nil || c.Imports.Selector == nil || c.Imports.EffectiveSelector() != "" {
			t.Errorf("selector %v %v", c.Imports.Selector, err)
		}
	})
}

func TestBadServicesFieldsFailNamingTheField(t *testing.T) {
	base := "cluster: east\nnode: n1\nbroker: 10.0.0.1:7443\n"
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"a listen address without a port", "dns: {listen: 10.1.0.1}\n", []string{`dns.listen: "10.1.0.1" is not ip:port`}},
		{"an upstream that is no address", "dns: {upstream: [10.0.0.1, dns.google]}\n", []string{`dns.upstream[1]: "dns.google"`}},
		{"an upstream that is a mapping", "dns: {upstream: {a: b}}\n", []string{"want a string or a list of strings"}},
		{"a ttl out of range", "dns: {ttl: 7200}\n", []string{"dns.ttl: 7200"}},
		{"an allowClients entry that is no CIDR", "dns: {allowClients: [10.0.0.0/8, 10.1.0.1]}\n", []string{"dns.allowClients[1]", "10.1.0.1"}},
		{"a relative cgroupPath", "cgroupPath: sys/fs/cgroup\n", []string{`cgroupPath: "sys/fs/cgroup" is not an absolute path`}},
		{"a relative bpfPinDir", "bpfPinDir: bpf\n", []string{`bpfPinDir: "bpf"`}},
		{"a service map too small", "loadBalancer: {serviceMapEntries: 8}\n", []string{"loadBalancer.serviceMapEntries: 8 is out of range (16..4194304"}},
		{"a backend map too large", "loadBalancer: {backendMapEntries: 4194305}\n", []string{"loadBalancer.backendMapEntries: 4194305"}},
		{"bpfPinDir at the bpffs root", "bpfPinDir: /sys/fs/bpf\n", []string{`bpfPinDir: "/sys/fs/bpf" must be a directory of its own`}},
		{"a selector that does not parse", "imports: {selector: \"a b\"}\n", []string{`imports.selector: import selector "a b"`}},
		{"an unknown imports field", "imports: {selecter: x}\n", []string{`unknown field "selecter"`}},
		{"an export without a name", "exports: [{namespace: shop, ports: [{port: 80}]}]\n", []string{"exports[0].name"}},
		{"an export port out of range", "exports: [{name: web, namespace: shop, ports: [{port: 70000}]}]\n", []string{"exports[0].ports[0].port: 70000 is not a port"}},
		{"a negative export port", "exports: [{name: web, namespace: shop, ports: [{port: -1}]}]\n", []string{"exports[0].ports[0].port: -1"}},
		{"an unknown protocol", "exports: [{name: web, namespace: shop, ports: [{port: 80, protocol: icmp}]}]\n", []string{`exports[0].ports[0].protocol: "ICMP"`}},
		{"an endpoint that is no IP", "exports: [{name: web, namespace: shop, ports: [{port: 80}], endpoints: [{ip: web-0}]}]\n", []string{`exports[0].endpoints[0].ip: "web-0"`}},
		{"a ClusterSetIP export without ports", "exports: [{name: web, namespace: shop}]\n", []string{"exports[0].ports: a ClusterSetIP service needs at least one port"}},
		{"a bad affinity", "exports: [{name: web, namespace: shop, affinity: near, ports: [{port: 80}]}]\n", []string{`exports[0].affinity: "near"`}},
		{"one service exported twice", "exports: [{name: web, namespace: shop, ports: [{port: 80}]}, {name: web, namespace: shop, ports: [{port: 81}]}]\n", []string{"exports[1]: shop/web is exported twice (also exports[0])"}},
		{"an unknown export field", "exports: [{name: web, namespace: shop, port: 80}]\n", []string{`unknown field "port"`}},
		{"kubernetes.enabled must be a bool", "kubernetes: {enabled: maybe}\n", []string{"line 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(base + tt.yaml))
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
