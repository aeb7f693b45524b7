// Package statusapi is the agent's local status API: the JSON document the agent serves over its
// unix socket (HTTP GET /v1/status) and `cablectl status` prints. The JSON keys are a contract.
package statusapi

import "time"

// Path is the HTTP path of the status document on the agent's unix socket.
const Path = "/v1/status"

// ServicesPath is the HTTP path of the services section alone (GET), cheaper than the whole
// status: it does not read the cable devices.
const ServicesPath = "/v1/services"

// ExportsPath is the prefix of the runtime exports: PUT ExportsPath+"NAMESPACE/NAME" with an
// Export as JSON body exports (or replaces) a service; DELETE withdraws it. Errors come back as
// an Error document with 400 (bad input), 404 (no such runtime export), 409 (the export is
// defined in the config file) or 500.
const ExportsPath = "/v1/exports/"

type Status struct {
	Cluster   string `json:"cluster"`
	ClusterID uint32 `json:"clusterID"`
	Node      string `json:"node"`
	Gateway   bool   `json:"gateway"`
	// MeshAddress is this gateway's mesh address, allocated by the broker (gateway mode): what
	// its gateway-mode pairs carry and where its ingress serves. Empty when none (yet).
	MeshAddress string `json:"meshAddress,omitempty"`
	// Version is the agent's build (cablectl version).
	Version string `json:"version,omitempty"`
	Broker  Broker `json:"broker"`
	// Config is the agent config in force (nil when the agent watches no file).
	Config      *ConfigStatus `json:"config,omitempty"`
	Connections []Connection  `json:"connections"`
	// Decisions are the connection policies' verdicts for every remote cluster with a live
	// endpoint, connected or not: why a cluster is absent from Connections. Gateways only.
	Decisions []Decision `json:"decisions,omitempty"`
	// Drivers are the cable drivers this gateway is configured with, and whether each runs.
	Drivers []DriverStatus `json:"drivers,omitempty"`
	// Services is the services datapath: exports, imports, DNS and the eBPF load balancer.
	Services *Services `json:"services,omitempty"`
	// Ingress is the gateway's ingress: ingress ports and the xDS server (gateways only).
	Ingress *Ingress `json:"ingress,omitempty"`
	// Worker is a non-gateway node's view of its cluster's gateways (see Worker).
	Worker *Worker `json:"worker,omitempty"`
	// Problems are what the operator should act on: a join token file others can read, a remote
	// cluster's subnet the agent refuses to route, a pair it cannot connect, a certificate the
	// broker no longer accepts. Those of a remote cluster name it (and are also the message of
	// its connection).
	Problems []Problem `json:"problems,omitempty"`
}

// Problem is one thing the operator should act on.
type Problem struct {
	// Cluster is the remote cluster it concerns ("" when it concerns the node).
	Cluster string `json:"cluster,omitempty"`
	Message string `json:"message"`
}

// Error is the body of an error answer of the agent's API.
type Error struct {
	Error string `json:"error"`
}

// Export is one service export as cablectl sends it and the status shows it (the agent config's
// exports[] item).
type Export struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Type      string            `json:"type,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Affinity  string            `json:"affinity,omitempty"`
	Ports     []ServicePort     `json:"ports"`
	Endpoints []ServiceEndpoint `json:"endpoints"`
}

// ExportResult answers a runtime export: the export as normalised (defaults filled).
type ExportResult struct {
	Export Export `json:"export"`
	// Source says where the export is defined: runtime (cablectl), config or kubernetes.
	Source string `json:"source"`
}

// Services is the services part of the status.
type Services struct {
	// ImportSelector is the selector this agent sends the broker ("" imports nothing).
	ImportSelector string `json:"importSelector"`
	// ImportsKnown is false until the broker sent the imports once (or they were loaded from the
	// cache): DNS answers SERVFAIL until then.
	ImportsKnown bool            `json:"importsKnown"`
	Imports      []ServiceImport `json:"imports"`
	// Exports are this node's exports, from every source.
	Exports []NodeExport `json:"exports"`
	// Sync is the last SetExports exchange with the broker.
	Sync         ExportSync   `json:"sync"`
	DNS          DNSStatus    `json:"dns"`
	LoadBalancer LoadBalancer `json:"loadBalancer"`
	// Problems are inputs the planner left out (bad addresses, duplicate VIPs).
	Problems []string `json:"problems,omitempty"`
}

// NodeExport is one export of this node and where it is defined.
type NodeExport struct {
	Export
	// Source: config, runtime or kubernetes.
	Source string `json:"source"`
	// Shadowed says which source's export of the same namespace/name wins over this one.
	Shadowed string `json:"shadowedBy,omitempty"`
}

// ExportSync is the state of the exports at the broker.
type ExportSync struct {
	// InSync is true when the broker holds the node's current exports.
	InSync   bool       `json:"inSync"`
	Revision uint64     `json:"revision,omitempty"`
	LastSync *time.Time `json:"lastSync,omitempty"`
	Error    string     `json:"error,omitempty"`
	// Conflicts are the conflicts of this cluster's exports in their imports (MCS: the oldest
	// export wins).
	Conflicts []ServiceConflict `json:"conflicts,omitempty"`
}

// DNSStatus is the clusterset.local DNS server.
type DNSStatus struct {
	Enabled   bool     `json:"enabled"`
	Listen    string   `json:"listen,omitempty"`
	Upstreams []string `json:"upstreams,omitempty"`
	Error     string   `json:"error,omitempty"`
	// Clients are the CIDRs the server answers besides loopback and the node's own addresses
	// (any other source is REFUSED).
	Clients []string `json:"clients,omitempty"`
	// Warnings are configuration warnings, e.g. a wildcard dns.listen.
	Warnings []string `json:"warnings,omitempty"`
}

// LoadBalancer is the eBPF socket load balancer.
type LoadBalancer struct {
	Running    bool   `json:"running"`
	CgroupPath string `json:"cgroupPath,omitempty"`
	PinDir     string `json:"pinDir,omitempty"`
	// Error says why it does not run, or why the last sync failed.
	Error string `json:"error,omitempty"`
	// Services is how many VIP x port services the maps hold.
	Services int `json:"services"`
	// SocketsDestroyed counts the sockets aborted because their backend left, since start.
	SocketsDestroyed uint64 `json:"socketsDestroyed"`
	// ServiceMapEntries and BackendMapEntries are the sizes of the maps; Refused counts the
	// imports they are too full for (each says why in its loadBalancerRefused).
	ServiceMapEntries int `json:"serviceMapEntries,omitempty"`
	BackendMapEntries int `json:"backendMapEntries,omitempty"`
	Refused           int `json:"refused,omitempty"`
}

// ServiceImport is one imported service as this node uses it.
type ServiceImport struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Type      string        `json:"type"`
	VIPs      []string      `json:"vips,omitempty"`
	Ports     []ServicePort `json:"ports"`
	// Affinity is the one in force on this node: local or none.
	Affinity  string            `json:"affinity"`
	Clusters  []ImportedCluster `json:"clusters"`
	Conflicts []ServiceConflict `json:"conflicts,omitempty"`
	// LoadBalancerRefused is why the load balancer's maps do not hold this service (they are
	// too full for it); empty when they do, or when it is not load-balanced.
	LoadBalancerRefused string `json:"loadBalancerRefused,omitempty"`
}

// ServicePort is one port of a service.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Port     uint32 `json:"port"`
	Protocol string `json:"protocol"`
}

// ServiceEndpoint is one backend address of a service in one cluster.
type ServiceEndpoint struct {
	IP       string `json:"ip"`
	Hostname string `json:"hostname,omitempty"`
	Ready    bool   `json:"ready"`
}

// ImportedCluster is one exporting cluster of an import, as this node sees it.
type ImportedCluster struct {
	Cluster        string            `json:"cluster"`
	ClusterID      uint32            `json:"clusterID"`
	Local          bool              `json:"local,omitempty"`
	Endpoints      []ServiceEndpoint `json:"endpoints"`
	ReadyEndpoints int               `json:"readyEndpoints"`
	// Usable says whether this node sends traffic to the cluster now; Reason says why (not).
	Usable bool   `json:"usable"`
	Reason string `json:"reason,omitempty"`
	// GatewayMode: the pair with this cluster is in gateway mode; its backends are its gateway's
	// ingress (mesh address : ingress port), and Reason says which, or that none serves it yet.
	GatewayMode bool `json:"gatewayMode,omitempty"`
	// Backends are this cluster's backends in the eBPF maps, "ip:port/proto", read back from
	// the maps.
	Backends []string `json:"backends"`
}

// ServiceConflict is an export left out of an import.
type ServiceConflict struct {
	Cluster string `json:"cluster"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Traffic are the eBPF counters of one remote cluster on the cable interfaces.
type Traffic struct {
	RxPackets uint64 `json:"rxPackets"`
	RxBytes   uint64 `json:"rxBytes"`
	TxPackets uint64 `json:"txPackets"`
	TxBytes   uint64 `json:"txBytes"`
}

// Decision is what the connection policies decided for the pair (this cluster, Cluster).
type Decision struct {
	Cluster string `json:"cluster"`
	Connect bool   `json:"connect"`
	// Driver is the cable of a connecting pair.
	Driver string `json:"driver,omitempty"`
	// Policy names the policy that decided ("" when none covers the pair).
	Policy string `json:"policy,omitempty"`
	// Default is true when the mesh default policy decided.
	Default bool `json:"default,omitempty"`
	// Mode is gateway (either cluster joined in gateway mode, or the policy says mode: gateway:
	// the cable carries only the two gateways' mesh addresses) or direct.
	Mode string `json:"mode,omitempty"`
}

// DriverStatus is one configured cable driver on this gateway.
type DriverStatus struct {
	Name string `json:"name"`
	// Running is false when the driver's initialisation failed; Error says why.
	Running bool   `json:"running"`
	Port    int    `json:"port,omitempty"`
	Error   string `json:"error,omitempty"`
	// Daemon is the process the driver depends on (ipsec: charon), as the agent found it when
	// it built this status; absent for drivers without one.
	Daemon *Daemon `json:"daemon,omitempty"`
}

// Daemon is a process a cable driver depends on.
type Daemon struct {
	Name string `json:"name"`
	PID  int    `json:"pid,omitempty"`
	// State is running, stopped (SIGSTOP: alive but doing nothing) or "not running".
	State string `json:"state"`
	// Control is the daemon's control socket (charon: vici); Answering says it answered a
	// request just now, Error why not.
	Control   string `json:"control,omitempty"`
	Answering bool   `json:"answering"`
	Error     string `json:"error,omitempty"`
}

type Broker struct {
	Address   string `json:"address"`
	Connected bool   `json:"connected"`
	// Revision is the last broker revision this agent applied.
	Revision    uint64     `json:"revision"`
	LastContact *time.Time `json:"lastContact,omitempty"`
	Error       string     `json:"error,omitempty"`
	// Cached is true when the agent runs on state loaded from its state dir, not yet resynced.
	Cached bool `json:"cached"`
	// CertificateNotAfter is when the agent's certificate expires; the agent renews it (over its
	// current identity) at CertificateRenewAt, two thirds into its lifetime, or at once when the
	// broker's CA bundle names another issuing CA (a CA rotation).
	CertificateNotAfter *time.Time `json:"certificateNotAfter,omitempty"`
	CertificateRenewAt  *time.Time `json:"certificateRenewAt,omitempty"`
	// CertificateRefused is true once the broker refused the certificate for good (the node was
	// revoked, or joined again elsewhere): the agent stops calling the broker and runs on its
	// state; Error says to join again.
	CertificateRefused bool `json:"certificateRefused,omitempty"`
	// Version is the broker's build, from its last register or heartbeat reply (gateways).
	Version string `json:"version,omitempty"`
	// ClockSkewMs is the broker's clock minus this node's, measured on the last register or
	// heartbeat reply (gateways only), good to ClockSkewUncertaintyMs (half the round trip);
	// ClockMeasuredAt is when. Absent until measured.
	ClockSkewMs            *float64   `json:"clockSkewMs,omitempty"`
	ClockSkewUncertaintyMs *float64   `json:"clockSkewUncertaintyMs,omitempty"`
	ClockMeasuredAt        *time.Time `json:"clockMeasuredAt,omitempty"`
}

// Connection is one remote cluster as seen from this node.
type Connection struct {
	Cluster   string `json:"cluster"`
	ClusterID uint32 `json:"clusterID"`
	Node      string `json:"node,omitempty"`
	Driver    string `json:"driver"`
	// Mode is the pair's mode, gateway or direct (see Decision.Mode).
	Mode string `json:"mode,omitempty"`
	// Policy names the connection policy that decided this pair's connection and driver.
	Policy string `json:"policy,omitempty"`
	// AppliedRevision is the broker revision at which this agent last (re)connected the pair
	// through its driver: after a policy change at revision R, the pair carries the new decision
	// once AppliedRevision >= R. 0 when not applied by this process (yet).
	AppliedRevision uint64 `json:"appliedRevision,omitempty"`
	// State is connected | connecting | error: read from the device, and error when the health
	// probes failed healthCheck.failureThreshold times in a row (see Health).
	State         string     `json:"state"`
	Message       string     `json:"message,omitempty"`
	Endpoint      string     `json:"endpoint"`
	RTT           *RTT       `json:"rtt,omitempty"`
	RxBytes       uint64     `json:"rxBytes"`
	TxBytes       uint64     `json:"txBytes"`
	LastHandshake *time.Time `json:"lastHandshake"`
	MTU           int        `json:"mtu,omitempty"`
	Subnets       []string   `json:"subnets,omitempty"`
	// Health is the state of the probes through this connection; absent when probing is off
	// (healthCheck.enabled: false) or the node is not a gateway.
	Health *Health `json:"health,omitempty"`
	// Traffic is what the eBPF counters on the cable interfaces saw of this cluster's subnets;
	// absent without the counters.
	Traffic *Traffic `json:"traffic,omitempty"`
}

// Health is what the probes of one connection found.
type Health struct {
	// Probing is false when the connection cannot be probed; Reason says why (e.g. the remote
	// endpoint publishes no health_check_ip). Its state then comes from the device alone.
	Probing bool   `json:"probing"`
	Reason  string `json:"reason,omitempty"`
	// Healthy is false after failureThreshold consecutive failed probes, until one succeeds.
	Healthy bool `json:"healthy"`
	// Source is this node's health-check address, Target the remote endpoint's health_check_ip.
	Source string `json:"source,omitempty"`
	Target string `json:"target,omitempty"`
	// ProbesSent and ProbesFailed count since the prober started (agent start or a new target).
	ProbesSent          uint64 `json:"probesSent"`
	ProbesFailed        uint64 `json:"probesFailed"`
	ConsecutiveFailures int    `json:"consecutiveFailures"`
	FailureThreshold    int    `json:"failureThreshold,omitempty"`
	PeriodMs            int64  `json:"periodMs,omitempty"`
	// Samples is how many RTT samples the RTT statistics cover (the window).
	Samples     int        `json:"samples"`
	LastProbe   *time.Time `json:"lastProbe,omitempty"`
	LastSuccess *time.Time `json:"lastSuccess,omitempty"`
	// LastError is the last failed probe's error, kept after recovery for diagnosis.
	LastError string `json:"lastError,omitempty"`
}

// RTT figures from health probes, in milliseconds. Last is the latest successful probe; the
// others cover the window of the latest samples (Health.Samples, at most healthCheck.window).
// Percentiles are nearest-rank: always a measured sample.
type RTT struct {
	LastMs float64 `json:"lastMs"`
	MinMs  float64 `json:"minMs"`
	AvgMs  float64 `json:"avgMs"`
	MaxMs  float64 `json:"maxMs"`
	P50Ms  float64 `json:"p50Ms"`
	P95Ms  float64 `json:"p95Ms"`
	P99Ms  float64 `json:"p99Ms"`
}
