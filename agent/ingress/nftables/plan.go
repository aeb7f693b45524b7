package nftables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/cablemesh/cablemesh/agent/ingress"
)

// The pure half: Config → Plan, validated and normalised (sorted, deduplicated) so that the same
// Config in any order yields the same Plan and so the same kernel table. No I/O here.

// Table names and chain names: everything lives in one table so that one batch replaces it and
// `nft list table ip cablemesh-ingress` shows all of it.
const (
	TableName = "cablemesh-ingress"
	// SetRemoteMesh holds Config.RemoteMeshAddresses: traffic to them is SNATed.
	SetRemoteMesh = "remote_mesh"

	ChainPrerouting  = "prerouting"  // nat, hook prerouting, priority dstnat: ip daddr MESH → jump services
	ChainOutput      = "output"      // nat, hook output, priority dstnat: the same for the gateway's own processes
	ChainServices    = "services"    // regular: one rule per served port with backends
	ChainInput       = "input"       // filter, hook input, priority filter: ports without backends are rejected
	ChainPostrouting = "postrouting" // nat, hook postrouting, priority srcnat: ip daddr @remote_mesh → snat to MESH
)

// Plan is what the table must hold.
type Plan struct {
	// Mesh is the served and SNAT address; invalid = no table at all.
	Mesh netip.Addr
	// Remote is the remote mesh addresses, sorted and unique.
	Remote []netip.Addr
	// Ports is every served port, sorted by protocol then port.
	Ports []PortPlan
}

// PortPlan is one ingress port.
type PortPlan struct {
	Proto    uint8 // IPPROTO_TCP or IPPROTO_UDP
	Port     uint16
	Label    string           // "namespace/name:portName", the rule comment
	Backends []netip.AddrPort // sorted, unique
}

// ProtoName is "tcp" or "udp".
func (p PortPlan) ProtoName() string {
	if p.Proto == protoUDP {
		return "udp"
	}
	return "tcp"
}

// BackendChain names the chain DNATing to backend i of a port with several backends (picked by
// numgen random through a verdict map, as kube-proxy's nftables mode does).
func (p PortPlan) BackendChain(i int) string {
	return "be-" + p.ProtoName() + "-" + strconv.Itoa(int(p.Port)) + "-" + strconv.Itoa(i)
}

// MapName names the verdict map from numgen's pick to the backend chains of a port with several
// backends.
func (p PortPlan) MapName() string {
	return "lb-" + p.ProtoName() + "-" + strconv.Itoa(int(p.Port))
}

const (
	protoTCP uint8 = 6
	protoUDP uint8 = 17
)

// NewPlan validates cfg and computes its Plan. Errors name the field and the value.
func NewPlan(cfg ingress.Config) (Plan, error) {
	var p Plan
	if cfg.MeshAddress.IsValid() {
		if !cfg.MeshAddress.Is4() {
			return Plan{}, fmt.Errorf("MeshAddress %s: must be IPv4 (the ingress is IPv4 only)", cfg.MeshAddress)
		}
		if cfg.MeshAddress.IsUnspecified() || cfg.MeshAddress.IsMulticast() || cfg.MeshAddress.IsLoopback() {
			return Plan{}, fmt.Errorf("MeshAddress %s: must be a unicast address", cfg.MeshAddress)
		}
	}
	for i, a := range cfg.RemoteMeshAddresses {
		if !a.IsValid() || !a.Is4() {
			return Plan{}, fmt.Errorf("RemoteMeshAddresses[%d] %q: must be an IPv4 address", i, a)
		}
		if a == cfg.MeshAddress {
			return Plan{}, fmt.Errorf("RemoteMeshAddresses[%d] %s: is this gateway's own MeshAddress", i, a)
		}
		p.Remote = append(p.Remote, a)
	}
	slices.SortFunc(p.Remote, netip.Addr.Compare)
	p.Remote = slices.Compact(p.Remote)

	type key struct {
		proto uint8
		port  uint16
	}
	seen := map[key]string{}
	for si, svc := range cfg.Services {
		for pi, port := range svc.Ports {
			field := fmt.Sprintf("Services[%d](%s/%s).Ports[%d]", si, svc.Namespace, svc.Name, pi)
			var proto uint8
			switch port.Protocol {
			case "TCP":
				proto = protoTCP
			case "UDP":
				proto = protoUDP
			default:
				return Plan{}, fmt.Errorf("%s.Protocol %q: must be TCP or UDP", field, port.Protocol)
			}
			if port.IngressPort == 0 {
				return Plan{}, fmt.Errorf("%s.IngressPort 0: must be 1-65535", field)
			}
			k := key{proto, port.IngressPort}
			if other, dup := seen[k]; dup {
				return Plan{}, fmt.Errorf("%s.IngressPort %d/%s: already used by %s", field, port.IngressPort, port.Protocol, other)
			}
			seen[k] = field
			pp := PortPlan{Proto: proto, Port: port.IngressPort, Label: svc.Namespace + "/" + svc.Name + ":" + port.Name}
			for bi, b := range port.Backends {
				if !b.IsValid() || !b.Addr().Is4() || b.Addr().IsUnspecified() || b.Addr().IsMulticast() {
					return Plan{}, fmt.Errorf("%s.Backends[%d] %q: must be an IPv4 unicast address:port", field, bi, b)
				}
				if b.Port() == 0 {
					return Plan{}, fmt.Errorf("%s.Backends[%d] %s: port 0", field, bi, b)
				}
				pp.Backends = append(pp.Backends, b)
			}
			slices.SortFunc(pp.Backends, netip.AddrPort.Compare)
			pp.Backends = slices.Compact(pp.Backends)
			p.Ports = append(p.Ports, pp)
		}
	}
	slices.SortFunc(p.Ports, func(a, b PortPlan) int {
		return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
	})
	if !cfg.MeshAddress.IsValid() {
		// Nothing is served or translated without a mesh address: the Config was still checked,
		// so a bad one fails now rather than when the address arrives.
		return Plan{}, nil
	}
	p.Mesh = cfg.MeshAddress
	return p, nil
}

// Counts summarises the plan for Status.
func (p Plan) Counts() (ports, withoutBackends, backends int) {
	for _, pp := range p.Ports {
		ports++
		if len(pp.Backends) == 0 {
			withoutBackends++
		}
		backends += len(pp.Backends)
	}
	return
}
