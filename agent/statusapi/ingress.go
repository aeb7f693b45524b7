package statusapi

import "time"

// Ingress is the gateway's ingress: the ports of the exported services and, with an xDS server,
// what every xDS client (the ingress Envoy, proxyless gRPC clients) accepted.
type Ingress struct {
	// Mode is the data plane, kernel or envoy (ingress.mode).
	Mode string `json:"mode"`
	// Ports are the ingress ports allocated to this node's exported service ports.
	Ports []IngressPort `json:"ports"`
	// Error says why a port could not be allocated, or why the last snapshot was not built.
	Error string `json:"error,omitempty"`
	// XDS is the xDS server; nil when ingress.xds.listen is unset.
	XDS *XDSStatus `json:"xds,omitempty"`
	// Dataplane is the gateway-mode data plane (nftables): SNAT to the mesh address and, in
	// kernel mode, the DNAT of the ingress ports. Gateways only.
	Dataplane *IngressDataplane `json:"dataplane,omitempty"`
}

// IngressDataplane is what the gateway's ingress data plane has programmed.
type IngressDataplane struct {
	// Kind is the implementation: nftables (table ip cablemesh-ingress).
	Kind string `json:"kind"`
	// MeshLink is the link holding the mesh address (cbl-mesh0) once it is there.
	MeshLink string `json:"meshLink,omitempty"`
	// Programmed: the kernel holds the last applied configuration.
	Programmed bool `json:"programmed"`
	// RemoteMeshAddresses counts the remote gateways traffic is SNATed for; Ports the ingress
	// ports served (PortsWithoutBackends of them reject); Backends the DNAT targets; Rules the
	// rules in the table.
	RemoteMeshAddresses  int        `json:"remoteMeshAddresses"`
	Ports                int        `json:"ports"`
	PortsWithoutBackends int        `json:"portsWithoutBackends"`
	Backends             int        `json:"backends"`
	Rules                int        `json:"rules"`
	LastApply            *time.Time `json:"lastApply,omitempty"`
	// Error is why the data plane is not programmed as wanted (cannot open, mesh link, last
	// apply); the previous rules stay in force.
	Error string `json:"error,omitempty"`
}

// IngressPort is one exported service port and its ingress port.
type IngressPort struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Port        uint32 `json:"port"`
	Protocol    string `json:"protocol"`
	IngressPort uint32 `json:"ingressPort"`
}

// XDSStatus is the agent's xDS server.
type XDSStatus struct {
	Listen string `json:"listen"`
	// IngressPortsBind is the address the per-port listeners (ingress-tcp-<port>) of the last
	// snapshot bind: the node's mesh address once cbl-mesh0 holds it (gateway mode), else
	// 0.0.0.0; IngressPortsBindNote says why it is the wildcard.
	IngressPortsBind     string `json:"ingressPortsBind,omitempty"`
	IngressPortsBindNote string `json:"ingressPortsBindNote,omitempty"`
	// Versions are the current snapshot's versions by resource type (listeners, routes,
	// clusters, endpoints, secrets): hashes of the content, unchanged while nothing changes.
	Versions map[string]string `json:"versions"`
	// Nodes are the xDS clients that connected, by node ID: at most MaxNodes, each kept while it
	// has a stream open and NodeTTL after (agent/xds node table).
	Nodes []XDSNode `json:"nodes"`
	// MaxNodes and NodeTTL are the node table's bounds.
	MaxNodes int    `json:"maxNodes,omitempty"`
	NodeTTL  string `json:"nodeTTL,omitempty"`
	// Access says who may connect to the socket besides root and the agent's user.
	AllowUID uint32 `json:"allowUID,omitempty"`
	AllowGID uint32 `json:"allowGID,omitempty"`
	// RefusedConnections counts the connections refused by their peer's uid/gid (SO_PEERCRED);
	// LastRefused says whose and when.
	RefusedConnections uint64 `json:"refusedConnections,omitempty"`
	LastRefused        string `json:"lastRefused,omitempty"`
	// IngressCertificate says what the ingress serves over SDS: "ingress certificate SERIAL
	// until TIME", or why none (the agent's own key is never served).
	IngressCertificate string `json:"ingressCertificate,omitempty"`
}

// XDSNode is one xDS client's state per resource type.
type XDSNode struct {
	Node string `json:"node"`
	// Streams are the node's open streams; 0: it left, and is forgotten after the TTL.
	Streams int       `json:"streams"`
	Types   []XDSType `json:"types"`
}

// XDSType is one resource type of one xDS client.
type XDSType struct {
	Type string `json:"type"`
	// Sent is the last version sent to the client; Acked the last one it accepted. Acked equal
	// to the current version means the client runs the agent's current configuration.
	Sent  string `json:"sent,omitempty"`
	Acked string `json:"acked,omitempty"`
	// NackError is the error_detail of the client's last NACK (Envoy's reason for refusing
	// NackVersion), shown until it ACKs a later version.
	NackError   string     `json:"nackError,omitempty"`
	NackVersion string     `json:"nackVersion,omitempty"`
	Updated     *time.Time `json:"updated,omitempty"`
}
