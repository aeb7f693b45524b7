package config

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// Defaults of the services fields.
const (
	// DefaultBPFPinDir is where the eBPF maps and links of the services datapath are pinned.
	DefaultBPFPinDir = "/sys/fs/bpf/cablemesh"
	// BPFFSMount is where bpffs is mounted on a node; the agent mounts it there when the pin dir
	// lies below it and it is not mounted yet.
	BPFFSMount = "/sys/fs/bpf"
	// DefaultDNSTTL is the TTL of the clusterset.local records (agent/dns's default).
	DefaultDNSTTL = 5
)

// CgroupRoots are where the cgroup2 root is looked for when cgroupPath is unset, in order: a
// unified layout mounts it at /sys/fs/cgroup, a hybrid one at /sys/fs/cgroup/unified.
var CgroupRoots = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}

// DNS configures the clusterset.local DNS server the agent runs (agent/dns).
type DNS struct {
	// Listen is the ip:port the server answers on over UDP and TCP (e.g. the node's pod-facing
	// address, port 53). Default: "" (no DNS server).
	Listen string `yaml:"listen" json:"listen,omitempty"`
	// Upstream is where names outside clusterset.local are forwarded: ip, ip:port (port 53 by
	// default) or the absolute path of a resolv.conf; one value or a list, tried in order.
	// Default: none (such names are answered REFUSED).
	Upstream StringList `yaml:"upstream" json:"upstream,omitempty"`
	// TTL of the records, whole seconds, 1..3600. Default: 5.
	TTL int `yaml:"ttl" json:"ttl,omitempty"`
	// AllowClients are CIDRs whose hosts the server answers besides its own clients: the
	// cluster's pod and service CIDRs (podCIDRs and serviceCIDRs, else the cluster's at the
	// broker), the node's own addresses and loopback. Any other source is answered REFUSED,
	// so the server is never an open resolver. Give here, e.g., the nodes of a host-network
	// CoreDNS. Default: none.
	AllowClients []string `yaml:"allowClients" json:"allowClients,omitempty"`
}

// StringList is a YAML value that is either one string or a list of strings.
type StringList []string

// UnmarshalYAML accepts a scalar or a sequence of scalars.
func (l *StringList) UnmarshalYAML(n *yaml.Node) error {
	n = deref(n)
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			*l = nil
			return nil
		}
		*l = StringList{n.Value}
		return nil
	case yaml.SequenceNode:
		var out []string
		if err := n.Decode(&out); err != nil {
			return err
		}
		*l = out
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings, not %s", n.Line, kindName(n))
}

// Imports picks which service exports of the mesh this cluster imports.
type Imports struct {
	// Selector is a label selector (Kubernetes syntax) over the exports' labels. Unset: the
	// default cablemesh.io/exported=true (every export that does not opt out). Set to "" it
	// imports nothing (the importing side chooses).
	Selector *string `yaml:"selector" json:"selector,omitempty"`
}

// EffectiveSelector is the selector the agent sends to the broker: the configured one, or the
// default when unset.
func (i Imports) EffectiveSelector() string {
	if i.Selector == nil {
		return mcs.DefaultImportSelector
	}
	return *i.Selector
}

// Export is one service this node exports (the MCS ServiceExport with its endpoints).
type Export struct {
	// Name and Namespace: DNS labels. Required.
	Name      string `yaml:"name" json:"name"`
	Namespace string `yaml:"namespace" json:"namespace"`
	// Type is ClusterSetIP (default) or Headless.
	Type string `yaml:"type" json:"type,omitempty"`
	// Labels are matched by the importing clusters' imports.selector; cablemesh.io/exported=true
	// is added unless set.
	Labels map[string]string `yaml:"labels" json:"labels,omitempty"`
	// Affinity is local (default: callers in this cluster use its ready backends while there is
	// one) or none (every ready backend alike).
	Affinity string `yaml:"affinity" json:"affinity,omitempty"`
	// Ports: at least one for ClusterSetIP; each named when there are several.
	Ports []ExportPort `yaml:"ports" json:"ports,omitempty"`
	// Endpoints are the service's backends in this cluster.
	Endpoints []ExportEndpoint `yaml:"endpoints" json:"endpoints,omitempty"`
}

// ExportPort is one named port of an export.
type ExportPort struct {
	Name string `yaml:"name" json:"name,omitempty"`
	Port int    `yaml:"port" json:"port"`
	// Protocol is TCP (default), UDP or SCTP.
	Protocol string `yaml:"protocol" json:"protocol,omitempty"`
}

// ExportEndpoint is one backend of an export.
type ExportEndpoint struct {
	IP       string `yaml:"ip" json:"ip"`
	Hostname string `yaml:"hostname" json:"hostname,omitempty"`
	// Ready defaults to true; only ready endpoints are ever used.
	Ready *bool `yaml:"ready" json:"ready,omitempty"`
}

// ToProto converts e to the API's export (not normalised; see ExportFromProto for the way back).
// A port number outside 1..65535 is an error naming the field, so that it is not wrapped into
// range by the conversion.
func (e Export) ToProto(field string) (*apiv1.ServiceExport, error) {
	out := &apiv1.ServiceExport{Name: e.Name, Namespace: e.Namespace, Type: e.Type, Affinity: e.Affinity}
	if len(e.Labels) > 0 {
		out.Labels = map[string]string{}
		for k, v := range e.Labels {
			out.Labels[k] = v
		}
	}
	for i, p := range e.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return nil, fmt.Errorf("%s.ports[%d].port: %d is not a port (1..65535)", field, i, p.Port)
		}
		out.Ports = append(out.Ports, &apiv1.ServicePort{Name: p.Name, Port: uint32(p.Port), Protocol: p.Protocol})
	}
	for _, ep := range e.Endpoints {
		ready := ep.Ready == nil || *ep.Ready
		out.Endpoints = append(out.Endpoints, &apiv1.ServiceEndpoint{Ip: ep.IP, Hostname: ep.Hostname, Ready: ready})
	}
	return out, nil
}

// ExportFromProto is the config form of an API export.
func ExportFromProto(e *apiv1.ServiceExport) Export {
	out := Export{Name: e.GetName(), Namespace: e.GetNamespace(), Type: e.GetType(), Affinity: e.GetAffinity()}
	if len(e.GetLabels()) > 0 {
		out.Labels = map[string]string{}
		for k, v := range e.GetLabels() {
			out.Labels[k] = v
		}
	}
	for _, p := range e.GetPorts() {
		out.Ports = append(out.Ports, ExportPort{Name: p.GetName(), Port: int(p.GetPort()), Protocol: p.GetProtocol()})
	}
	for _, ep := range e.GetEndpoints() {
		r := ep.GetReady()
		out.Endpoints = append(out.Endpoints, ExportEndpoint{IP: ep.GetIp(), Hostname: ep.GetHostname(), Ready: &r})
	}
	return out
}

// NormalizeExport converts and validates one export with the MCS rules (mcs.Normalize): the
// error names the field (field, e.g. "exports[2]") and the value.
func NormalizeExport(field string, e Export) (*apiv1.ServiceExport, error) {
	p, err := e.ToProto(field)
	if err != nil {
		return nil, err
	}
	if err := mcs.Normalize(field, p); err != nil {
		return nil, err
	}
	return p, nil
}

// Kubernetes turns on the Kubernetes export source.
type Kubernetes struct {
	// Enabled: the agent watches MCS ServiceExport objects (with their Services and
	// EndpointSlices) through the in-cluster API server credentials and exports them. Default:
	// false.
	Enabled bool `yaml:"enabled" json:"enabled"`
}

// ExportsProto returns the config's exports, normalised (Validate has accepted them).
func (c *Config) ExportsProto() []*apiv1.ServiceExport { return c.Live().ExportsProto() }

// applyServicesDefaults fills the services fields' defaults.
func (c *Config) applyServicesDefaults() {
	if c.BPFPinDir == "" {
		c.BPFPinDir = DefaultBPFPinDir
	}
	if c.DNS.TTL == 0 {
		c.DNS.TTL = DefaultDNSTTL
	}
}

// validateServices checks dns, cgroupPath, bpfPinDir, imports and exports.
func (c *Config) validateServices() error {
	if c.DNS.Listen != "" {
		ap, err := netip.ParseAddrPort(c.DNS.Listen)
		if err != nil || ap.Addr().Zone() != "" {
			return fmt.Errorf("dns.listen: %q is not ip:port", c.DNS.Listen)
		}
	}
	for i, u := range c.DNS.Upstream {
		if err := checkUpstream(u); err != nil {
			return fmt.Errorf("dns.upstream[%d]: %q %v", i, u, err)
		}
	}
	if err := checkCIDRs("dns.allowClients", c.DNS.AllowClients); err != nil {
		return err
	}
	if c.DNS.TTL < 1 || c.DNS.TTL > 3600 {
		return fmt.Errorf("dns.ttl: %d is out of range (1..3600 seconds)", c.DNS.TTL)
	}
	if c.CgroupPath != "" && !filepath.IsAbs(c.CgroupPath) {
		return fmt.Errorf("cgroupPath: %q is not an absolute path", c.CgroupPath)
	}
	if !filepath.IsAbs(c.BPFPinDir) {
		return fmt.Errorf("bpfPinDir: %q is not an absolute path", c.BPFPinDir)
	}
	if filepath.Clean(c.BPFPinDir) == BPFFSMount || filepath.Clean(c.BPFPinDir) == "/" {
		return fmt.Errorf("bpfPinDir: %q must be a directory of its own below a bpf filesystem (e.g. %s), not its root", c.BPFPinDir, DefaultBPFPinDir)
	}
	if err := c.LoadBalancer.validate(); err != nil {
		return err
	}
	if c.Imports.Selector != nil {
		if _, err := mcs.ParseImportSelector(*c.Imports.Selector); err != nil {
			return fmt.Errorf("imports.selector: %w", err)
		}
	}
	seen := map[string]int{}
	for i, e := range c.Exports {
		field := fmt.Sprintf("exports[%d]", i)
		p, err := NormalizeExport(field, e)
		if err != nil {
			return err
		}
		k := mcs.Key(p.Namespace, p.Name)
		if j, dup := seen[k]; dup {
			return fmt.Errorf("%s: %s is exported twice (also exports[%d])", field, k, j)
		}
		seen[k] = i
	}
	return nil
}

// checkUpstream applies the DNS server's rule for an upstream: ip, ip:port or an absolute path.
func checkUpstream(u string) error {
	switch {
	case u == "":
		return errors.New("is empty")
	case strings.HasPrefix(u, "/"):
		return nil
	}
	if a, err := netip.ParseAddr(u); err == nil && a.Zone() == "" {
		return nil
	}
	if ap, err := netip.ParseAddrPort(u); err == nil && ap.Port() != 0 {
		return nil
	}
	return errors.New("is not ip, ip:port or the absolute path of a resolv.conf")
}

// LoadBalancer sizes the maps of the eBPF socket load balancer. A node needs one service map
// entry per imported VIP x port, plus one per backend of it, and one backend map entry per
// backend; when the imports need more, the maps take what fits and refuse the rest, service by
// service (see docs/limits.md). Each entry costs about 100 bytes of kernel memory, reserved when
// the map is created. Maps pinned by an earlier run keep their size until they are removed.
type LoadBalancer struct {
	// ServiceMapEntries sizes the service map; 0: 65536 (bpf.DefaultServiceMapEntries).
	ServiceMapEntries int `yaml:"serviceMapEntries" json:"serviceMapEntries,omitempty"`
	// BackendMapEntries sizes the backend map; 0: 65536 (bpf.DefaultBackendMapEntries).
	BackendMapEntries int `yaml:"backendMapEntries" json:"backendMapEntries,omitempty"`
}

// The bounds of loadBalancer.serviceMapEntries and backendMapEntries (bpf.MinMapEntries and
// bpf.MaxMapEntries; the config package does not load the bpf package).
const (
	minLBMapEntries = 16
	maxLBMapEntries = 1 << 22
)

func (l LoadBalancer) validate() error {
	for _, f := range []struct {
		name string
		n    int
	}{{"loadBalancer.serviceMapEntries", l.ServiceMapEntries}, {"loadBalancer.backendMapEntries", l.BackendMapEntries}} {
		if f.n != 0 && (f.n < minLBMapEntries || f.n > maxLBMapEntries) {
			return fmt.Errorf("%s: %d is out of range (%d..%d, or 0 for the default 65536)", f.name, f.n, minLBMapEntries, maxLBMapEntries)
		}
	}
	return nil
}
