package mcs

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

var t0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func export(cluster, typ string, age int, ports ...*apiv1.ServicePort) *apiv1.ServiceExport {
	return &apiv1.ServiceExport{
		Cluster: cluster, Node: cluster + "-gw", Namespace: "shop", Name: "web", Type: typ, Ports: ports,
		Labels:    map[string]string{LabelExported: "true"},
		Affinity:  AffinityLocal,
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.0.0.1", Ready: true}},
		Created:   timestamppb.New(t0.Add(time.Duration(age) * time.Second)),
	}
}

func port(name string, n uint32, proto string) *apiv1.ServicePort {
	return &apiv1.ServicePort{Name: name, Port: n, Protocol: proto}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*apiv1.ServiceExport)
		wantErr string
		check   func(*testing.T, *apiv1.ServiceExport)
	}{
		{name: "a minimal export gets its defaults", mutate: func(e *apiv1.ServiceExport) { e.Type, e.Affinity, e.Labels = "", "", nil }, check: func(t *testing.T, e *apiv1.ServiceExport) {
			if e.Type != TypeClusterSetIP || e.Affinity != AffinityLocal || e.Labels[LabelExported] != "true" {
				t.Errorf("defaults not applied: %+v", e)
			}
		}},
		{name: "an export that sets the exported label keeps its value", mutate: func(e *apiv1.ServiceExport) { e.Labels = map[string]string{LabelExported: "false"} }, check: func(t *testing.T, e *apiv1.ServiceExport) {
			if e.Labels[LabelExported] != "false" {
				t.Errorf("label overwritten: %v", e.Labels)
			}
		}},
		{name: "a lower-case protocol is upper-cased and an empty one is TCP", mutate: func(e *apiv1.ServiceExport) {
			e.Ports = []*apiv1.ServicePort{port("http", 80, "tcp"), port("dns", 53, "")}
		}, check: func(t *testing.T, e *apiv1.ServiceExport) {
			if e.Ports[0].Protocol != "TCP" || e.Ports[1].Protocol != "TCP" {
				t.Errorf("protocols %v", e.Ports)
			}
		}},
		{name: "endpoints come out sorted by address", mutate: func(e *apiv1.ServiceExport) {
			e.Endpoints = []*apiv1.ServiceEndpoint{{Ip: "10.0.0.9"}, {Ip: "10.0.0.10"}, {Ip: "::ffff:10.0.0.2"}}
		}, check: func(t *testing.T, e *apiv1.ServiceExport) {
			got := []string{e.Endpoints[0].Ip, e.Endpoints[1].Ip, e.Endpoints[2].Ip}
			if fmt.Sprint(got) != "[10.0.0.2 10.0.0.9 10.0.0.10]" {
				t.Errorf("endpoints %v", got)
			}
		}},
		{name: "a name that is no DNS label is refused, naming the field", mutate: func(e *apiv1.ServiceExport) { e.Name = "Web_1" }, wantErr: `exports[0].name: name "Web_1" is not a DNS label`},
		{name: "an unknown type is refused", mutate: func(e *apiv1.ServiceExport) { e.Type = "LoadBalancer" }, wantErr: `exports[0].type: "LoadBalancer" is not ClusterSetIP or Headless`},
		{name: "an unknown affinity is refused", mutate: func(e *apiv1.ServiceExport) { e.Affinity = "zone" }, wantErr: `exports[0].affinity: "zone"`},
		{name: "a ClusterSetIP service without ports is refused", mutate: func(e *apiv1.ServiceExport) { e.Ports = nil }, wantErr: "exports[0].ports: a ClusterSetIP service needs at least one port"},
		{name: "a headless service may have no ports", mutate: func(e *apiv1.ServiceExport) { e.Type, e.Ports = TypeHeadless, nil }},
		{name: "port 0 is refused", mutate: func(e *apiv1.ServiceExport) { e.Ports = []*apiv1.ServicePort{port("http", 0, "TCP")} }, wantErr: "exports[0].ports[0].port: 0 is not a port"},
		{name: "ICMP is no protocol for a service", mutate: func(e *apiv1.ServiceExport) { e.Ports = []*apiv1.ServicePort{port("http", 80, "icmp")} }, wantErr: `exports[0].ports[0].protocol: "ICMP" is not TCP, UDP or SCTP`},
		{name: "two ports need names", mutate: func(e *apiv1.ServiceExport) {
			e.Ports = []*apiv1.ServicePort{port("", 80, "TCP"), port("b", 81, "TCP")}
		}, wantErr: "exports[0].ports[0].name: is required"},
		{name: "a port name twice is refused", mutate: func(e *apiv1.ServiceExport) {
			e.Ports = []*apiv1.ServicePort{port("a", 80, "TCP"), port("a", 81, "TCP")}
		}, wantErr: `exports[0].ports[1].name: "a" is used twice`},
		{name: "a port name without a letter is refused", mutate: func(e *apiv1.ServiceExport) { e.Ports = []*apiv1.ServicePort{port("8080", 80, "TCP")} }, wantErr: `"8080" is not a port name`},
		{name: "a port name over 15 characters is refused", mutate: func(e *apiv1.ServiceExport) { e.Ports = []*apiv1.ServicePort{port("abcdefghijklmnop", 80, "TCP")} }, wantErr: "is not a port name"},
		{name: "the same port and protocol twice is refused", mutate: func(e *apiv1.ServiceExport) {
			e.Ports = []*apiv1.ServicePort{port("a", 80, "TCP"), port("b", 80, "TCP")}
		}, wantErr: "80/TCP is listed twice"},
		{name: "the same port over TCP and UDP is fine", mutate: func(e *apiv1.ServiceExport) {
			e.Ports = []*apiv1.ServicePort{port("a", 53, "TCP"), port("b", 53, "UDP")}
		}},
		{name: "an endpoint that is no IP is refused", mutate: func(e *apiv1.ServiceExport) { e.Endpoints = []*apiv1.ServiceEndpoint{{Ip: "web-1"}} }, wantErr: `exports[0].endpoints[0].ip: "web-1" is not a unicast IP address`},
		{name: "an endpoint address twice is refused", mutate: func(e *apiv1.ServiceExport) {
			e.Endpoints = []*apiv1.ServiceEndpoint{{Ip: "10.0.0.1"}, {Ip: "10.0.0.1"}}
		}, wantErr: "exports[0].endpoints[1].ip: 10.0.0.1 is listed twice"},
		{name: "a hostname that is no DNS label is refused", mutate: func(e *apiv1.ServiceExport) { e.Endpoints[0].Hostname = "db.0" }, wantErr: `exports[0].endpoints[0].hostname: hostname "db.0" is not a DNS label`},
		{name: "a bad label is refused", mutate: func(e *apiv1.ServiceExport) { e.Labels = map[string]string{"-x": "y"} }, wantErr: "exports[0].labels: label key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := export("east", TypeClusterSetIP, 0, port("http", 80, "TCP"))
			tt.mutate(e)
			err := Normalize("exports[0]", e)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if tt.check != nil {
				tt.check(t, e)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	ids := map[string]uint32{"east": 1, "west": 2, "north": 3}
	vips := map[string][]string{"shop/web": {"241.0.0.1"}}
	tests := []struct {
		name          string
		exports       []*apiv1.ServiceExport
		wantClusters  string
		wantPorts     string
		wantConflicts string
		wantType      string
		wantVIPs      string
	}{
		{
			name:         "two clusters exporting the same ports make one import with both",
			exports:      []*apiv1.ServiceExport{export("east", TypeClusterSetIP, 0, port("http", 80, "TCP")), export("west", TypeClusterSetIP, 1, port("http", 80, "TCP"))},
			wantClusters: "east west", wantPorts: "http:80/TCP", wantType: TypeClusterSetIP, wantVIPs: "[241.0.0.1]",
		},
		{
			name:         "ports are the union of the exports' ports",
			exports:      []*apiv1.ServiceExport{export("east", TypeClusterSetIP, 0, port("http", 80, "TCP")), export("west", TypeClusterSetIP, 1, port("https", 443, "TCP"))},
			wantClusters: "east west", wantPorts: "http:80/TCP https:443/TCP", wantType: TypeClusterSetIP, wantVIPs: "[241.0.0.1]",
		},
		{
			name:         "a conflicting type leaves the younger export out with a conflict",
			exports:      []*apiv1.ServiceExport{export("west", TypeHeadless, 5, port("http", 80, "TCP")), export("east", TypeClusterSetIP, 0, port("http", 80, "TCP"))},
			wantClusters: "east", wantPorts: "http:80/TCP", wantType: TypeClusterSetIP, wantVIPs: "[241.0.0.1]",
			wantConflicts: "west type: exported as Headless, but the oldest export (cluster east) is ClusterSetIP",
		},
		{
			name:         "the oldest export wins whatever the order it comes in",
			exports:      []*apiv1.ServiceExport{export("east", TypeClusterSetIP, 9, port("http", 80, "TCP")), export("west", TypeHeadless, 1, port("http", 80, "TCP"))},
			wantClusters: "west", wantPorts: "http:80/TCP", wantType: TypeHeadless, wantVIPs: "[]",
			wantConflicts: "east type: exported as ClusterSetIP, but the oldest export (cluster west) is Headless",
		},
		{
			name:         "a port name with another protocol is a conflict",
			exports:      []*apiv1.ServiceExport{export("east", TypeClusterSetIP, 0, port("echo", 7, "TCP")), export("west", TypeClusterSetIP, 1, port("echo", 7, "UDP"))},
			wantClusters: "east", wantPorts: "echo:7/TCP", wantType: TypeClusterSetIP, wantVIPs: "[241.0.0.1]",
			wantConflicts: `west ports: port "echo" is 7/UDP, but 7/TCP in an older export`,
		},
		{
			name:         "the same port under another name is a conflict",
			exports:      []*apiv1.ServiceExport{export("east", TypeClusterSetIP, 0, port("http", 80, "TCP")), export("west", TypeClusterSetIP, 1, port("web", 80, "TCP"))},
			wantClusters: "east", wantPorts: "http:80/TCP", wantType: TypeClusterSetIP, wantVIPs: "[241.0.0.1]",
			wantConflicts: `west ports: port 80/TCP is named "web", but "http" in an older export`,
		},
		{
			name:         "a cluster without an ID (being removed) is left out",
			exports:      []*apiv1.ServiceExport{export("east", TypeClusterSetIP, 0, port("http", 80, "TCP")), export("gone", TypeClusterSetIP, 1, port("http", 80, "TCP"))},
			wantClusters: "east", wantPorts: "http:80/TCP", wantType: TypeClusterSetIP, wantVIPs: "[241.0.0.1]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imps := Merge(tt.exports, ids, vips)
			if len(imps) != 1 {
				t.Fatalf("got %d imports, want 1", len(imps))
			}
			imp := imps[0]
			var cl, ps, cf []string
			for _, c := range imp.Clusters {
				cl = append(cl, c.Cluster)
				if c.ClusterId != ids[c.Cluster] {
					t.Errorf("cluster %s has ID %d", c.Cluster, c.ClusterId)
				}
			}
			for _, p := range imp.Ports {
				ps = append(ps, fmt.Sprintf("%s:%d/%s", p.Name, p.Port, p.Protocol))
			}
			for _, c := range imp.Conflicts {
				cf = append(cf, c.Cluster+" "+c.Field+": "+c.Message)
			}
			if got := strings.Join(cl, " "); got != tt.wantClusters {
				t.Errorf("clusters %q, want %q", got, tt.wantClusters)
			}
			if got := strings.Join(ps, " "); got != tt.wantPorts {
				t.Errorf("ports %q, want %q", got, tt.wantPorts)
			}
			if got := strings.Join(cf, "; "); got != tt.wantConflicts {
				t.Errorf("conflicts %q, want %q", got, tt.wantConflicts)
			}
			if imp.Type != tt.wantType || fmt.Sprint(imp.Vips) != tt.wantVIPs {
				t.Errorf("type %s vips %v, want %s %s", imp.Type, imp.Vips, tt.wantType, tt.wantVIPs)
			}
		})
	}
}

func TestMergeJoinsTheNodesOfOneCluster(t *testing.T) {
	a := export("east", TypeClusterSetIP, 0, port("http", 80, "TCP"))
	b := export("east", TypeClusterSetIP, 3, port("http", 80, "TCP"))
	b.Node = "east-gw2"
	b.Endpoints = []*apiv1.ServiceEndpoint{{Ip: "10.0.0.2", Ready: true}, {Ip: "10.0.0.1", Ready: false}}
	imps := Merge([]*apiv1.ServiceExport{b, a}, map[string]uint32{"east": 1}, nil)
	eps := imps[0].Clusters[0].Endpoints
	if len(eps) != 2 || eps[0].Ip != "10.0.0.1" || !eps[0].Ready || eps[1].Ip != "10.0.0.2" {
		t.Fatalf("endpoints %v: want both nodes' endpoints, the oldest node's copy of 10.0.0.1", eps)
	}
}

func TestVisible(t *testing.T) {
	east := export("east", TypeClusterSetIP, 0, port("http", 80, "TCP"))
	west := export("west", TypeClusterSetIP, 1, port("https", 443, "TCP"))
	west.Labels = map[string]string{LabelExported: "true", "env": "dev"}
	north := export("north", TypeClusterSetIP, 2, port("http", 80, "TCP"))
	imp := Merge([]*apiv1.ServiceExport{east, west, north}, map[string]uint32{"east": 1, "west": 2, "north": 3}, nil)[0]
	connected := func(c string) bool { return c == "west" || c == "north" }
	tests := []struct {
		name, self, selector string
		want, wantPorts      string
	}{
		{"the default selector sees its own cluster and connected ones", "east", DefaultImportSelector, "east north west", "80 443"},
		{"a cluster not connected by policy is not imported", "south", DefaultImportSelector, "north west", "80 443"},
		{"a selector picks exports by their labels", "east", "env=dev", "west", "443"},
		{"a not-equal selector excludes", "east", "env!=dev", "east north", "80"},
		{"an empty selector imports nothing", "east", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel, err := ParseImportSelector(tt.selector)
			if err != nil {
				t.Fatal(err)
			}
			v := Visible(imp, tt.self, connected, sel)
			var got, ports []string
			for _, c := range v.GetClusters() {
				got = append(got, c.Cluster)
			}
			for _, p := range v.GetPorts() {
				ports = append(ports, fmt.Sprint(p.Port))
			}
			if strings.Join(got, " ") != tt.want || strings.Join(ports, " ") != tt.wantPorts {
				t.Errorf("clusters %v ports %v, want %q %q", got, ports, tt.want, tt.wantPorts)
			}
			if tt.want == "" && v != nil {
				t.Errorf("want no import, got %v", v)
			}
		})
	}
	if _, err := ParseImportSelector("a=(b"); err == nil {
		t.Error("a malformed selector was accepted")
	}
}

func TestAllocateVIP(t *testing.T) {
	r := netip.MustParsePrefix("241.0.0.0/30")
	used := map[netip.Addr]bool{}
	a, err := AllocateVIP(r, used)
	if err != nil || a != netip.MustParseAddr("241.0.0.1") {
		t.Fatalf("first VIP %v %v, want 241.0.0.1", a, err)
	}
	used[a] = true
	b, _ := AllocateVIP(r, used)
	if b != netip.MustParseAddr("241.0.0.2") {
		t.Fatalf("second VIP %v, want 241.0.0.2", b)
	}
	used[b] = true
	if _, err := AllocateVIP(r, used); err == nil || !strings.Contains(err.Error(), "exhausted") {
		t.Fatalf("a /30 gave a third VIP (the broadcast address?): %v", err)
	}
	delete(used, a)
	if c, _ := AllocateVIP(r, used); c != a {
		t.Fatalf("a freed VIP is not the lowest free one: %v", c)
	}
	v6, err := AllocateVIP(netip.MustParsePrefix("fd00:241::/64"), map[netip.Addr]bool{})
	if err != nil || v6 != netip.MustParseAddr("fd00:241::1") {
		t.Fatalf("IPv6 VIP %v %v", v6, err)
	}
}

func TestParseVIPRanges(t *testing.T) {
	tests := []struct{ in, want, wantErr string }{
		{DefaultVIPRange, "[241.0.0.0/8]", ""},
		{"241.0.0.0/8,fd00:241::/64", "[241.0.0.0/8 fd00:241::/64]", ""},
		{"241.0.0.1/8", "", "has host bits set"},
		{"241.0.0.0/31", "", "too small"},
		{"10.0.0.0/8,11.0.0.0/8", "", "at most one IPv4 and one IPv6"},
		{"nope", "", "is not a CIDR"},
	}
	for _, tt := range tests {
		got, err := ParseVIPRanges(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseVIPRanges(%q) = %v, %v; want error %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != tt.want {
			t.Errorf("ParseVIPRanges(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

// FuzzNormalize: whatever Normalize accepts is valid again after a second pass and unchanged by it.
func FuzzNormalize(f *testing.F) {
	f.Add("web", "shop", "ClusterSetIP", "http", uint32(80), "tcp", "10.0.0.1", "web-0", "env=prod")
	f.Add("db", "shop", "Headless", "", uint32(0), "", "::1", "", "")
	f.Fuzz(func(t *testing.T, name, ns, typ, pname string, pnum uint32, proto, ip, host, label string) {
		e := &apiv1.ServiceExport{Name: name, Namespace: ns, Type: typ,
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: ip, Hostname: host}}}
		if pnum != 0 || pname != "" {
			e.Ports = []*apiv1.ServicePort{{Name: pname, Port: pnum, Protocol: proto}}
		}
		if k, v, ok := strings.Cut(label, "="); ok {
			e.Labels = map[string]string{k: v}
		}
		if Normalize("e", e) != nil {
			return
		}
		again := fmt.Sprint(e)
		if err := Normalize("e", e); err != nil {
			t.Fatalf("a normalized export is refused on a second pass: %v", err)
		}
		if fmt.Sprint(e) != again {
			t.Fatalf("Normalize is not idempotent: %s then %s", again, e)
		}
	})
}
