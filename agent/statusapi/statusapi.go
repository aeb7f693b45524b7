// Package statusapi is the agent's local status API: the JSON document the agent serves over its
// unix socket (HTTP GET /v1/status) and `cablectl status` prints. The JSON keys are a contract.
package statusapi

import "time"

// Path is the HTTP path of the status document on the agent's unix socket.
const Path = "/v1/status"

type Status struct {
	Cluster     string       `json:"cluster"`
	ClusterID   uint32       `json:"clusterID"`
	Node        string       `json:"node"`
	Gateway     bool         `json:"gateway"`
	Broker      Broker       `json:"broker"`
	Connections []Connection `json:"connections"`
	// Decisions are the connection policies' verdicts for every remote cluster with a live
	// endpoint, connected or not: why a cluster is absent from Connections. Gateways only.
	Decisions []Decision `json:"decisions,omitempty"`
	// Drivers are the cable drivers this gateway is configured with, and whether each runs.
	Drivers []DriverStatus `json:"drivers,omitempty"`
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
}

// DriverStatus is one configured cable driver on this gateway.
type DriverStatus struct {
	Name string `json:"name"`
	// Running is false when the driver's initialisation failed; Error says why.
	Running bool   `json:"running"`
	Port    int    `json:"port,omitempty"`
	Error   string `json:"error,omitempty"`
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
}

// Connection is one remote cluster as seen from this node.
type Connection struct {
	Cluster   string `json:"cluster"`
	ClusterID uint32 `json:"clusterID"`
	Node      string `json:"node,omitempty"`
	Driver    string `json:"driver"`
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
