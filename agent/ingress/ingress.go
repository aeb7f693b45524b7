// Package ingress holds the gateway ingress data plane's plain types: what a
// gateway serves on its mesh address and which remote mesh addresses its outgoing traffic is
// translated for, the Dataplane interface the agent drives, and the helper that puts the mesh
// address on the node (the cbl-mesh0 link).
//
// A gateway-mode pair's cable carries only the two gateways' mesh addresses. The calling gateway
// SNATs traffic to a remote mesh address to its own mesh address; the serving gateway DNATs
// "own mesh address : ingress port" to the service's ready local endpoints (kernel mode,
// agent/ingress/nftables) or hands it to Envoy (envoy mode: the data plane then does the SNAT
// and the UDP ports, which Envoy's TCP/HTTP ingress does not serve). Conntrack undoes both on replies, so the backend sees the calling gateway's mesh address.
//
// IPv4 only for now: the mesh address range is IPv4 (broker --mesh-address-range).
package ingress

import (
	"context"
	"net/netip"
	"time"
)

// Config is everything a gateway's ingress data plane programs. The zero Config programs nothing.
type Config struct {
	// MeshAddress is this gateway's mesh address (allocated by the broker). Invalid (the zero
	// netip.Addr) = none yet: nothing is served or translated. Must be IPv4 when valid.
	MeshAddress netip.Addr
	// RemoteMeshAddresses are the mesh addresses of the remote gateways of this node's
	// gateway-mode pairs: traffic to them (from pods and from the gateway itself) is SNATed to
	// MeshAddress. IPv4; duplicates are harmless.
	RemoteMeshAddresses []netip.Addr
	// Services are served by the kernel data plane on MeshAddress; in envoy mode only their UDP
	// ports (Envoy serves TCP).
	Services []Service
}

// Service is one exported service this gateway serves. Namespace and Name label the rules (for
// humans reading `nft list table`) and the errors; they play no part in matching.
type Service struct {
	Namespace, Name string
	Ports           []Port
}

// Port is one ingress port of a service.
type Port struct {
	// Name is the service port's name (may be empty for a single-port service).
	Name string
	// Protocol is "TCP" or "UDP" (SCTP is not served by the ingress).
	Protocol string
	// IngressPort is where the gateway serves this port on MeshAddress (ServicePort.ingress_port).
	// Unique per Protocol across all Services; never 0.
	IngressPort uint16
	// Backends are the service's ready local endpoints, ip:targetPort, IPv4. Empty: connections
	// to the ingress port fail fast (TCP reset / ICMP port unreachable) instead of hanging.
	Backends []netip.AddrPort
}

// Status is what a Dataplane has programmed, for `cablectl status`.
type Status struct {
	// Programmed: the data plane's kernel state holds the last applied Config.
	Programmed bool `json:"programmed"`
	// MeshAddress is the address served and SNATed to ("" when none).
	MeshAddress string `json:"meshAddress,omitempty"`
	// RemoteMeshAddresses counts the remote mesh addresses traffic is SNATed for.
	RemoteMeshAddresses int `json:"remoteMeshAddresses"`
	// Ports counts the ingress ports served (with or without backends); PortsWithoutBackends
	// those that reject; Backends counts backends over all ports.
	Ports                int `json:"ports"`
	PortsWithoutBackends int `json:"portsWithoutBackends"`
	Backends             int `json:"backends"`
	// Rules counts the rules the data plane holds in the kernel.
	Rules int `json:"rules"`
	// LastApply is when the last successful Apply finished (zero: never).
	LastApply time.Time `json:"lastApply,omitzero"`
	// LastError is the last Apply's error ("" when it succeeded).
	LastError string `json:"lastError,omitempty"`
}

// Dataplane programs a gateway's ingress. Implementations: agent/ingress/nftables (kernel).
type Dataplane interface {
	// Apply makes the kernel hold exactly cfg: idempotent, one atomic replace of everything the
	// data plane owns. A bad Config is refused with an error naming the field and the value, and
	// the old state stays in place.
	Apply(ctx context.Context, cfg Config) error
	// Status reports what is programmed: counts, the last apply time and error.
	Status() Status
	// Cleanup removes everything the data plane made (its table and the cbl-mesh0 link).
	Cleanup(ctx context.Context) error
	// Close releases handles and leaves the kernel state in place: an agent restart must not
	// break established flows.
	Close() error
}
