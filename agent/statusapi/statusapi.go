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
	// State is connected | connecting | error, read from the device.
	State         string     `json:"state"`
	Message       string     `json:"message,omitempty"`
	Endpoint      string     `json:"endpoint"`
	RTT           *RTT       `json:"rtt,omitempty"`
	RxBytes       uint64     `json:"rxBytes"`
	TxBytes       uint64     `json:"txBytes"`
	LastHandshake *time.Time `json:"lastHandshake"`
	MTU           int        `json:"mtu,omitempty"`
	Subnets       []string   `json:"subnets,omitempty"`
}

// RTT figures from health probes, in milliseconds.
type RTT struct {
	LastMs float64 `json:"lastMs"`
	MinMs  float64 `json:"minMs"`
	AvgMs  float64 `json:"avgMs"`
	MaxMs  float64 `json:"maxMs"`
	P50Ms  float64 `json:"p50Ms"`
	P95Ms  float64 `json:"p95Ms"`
	P99Ms  float64 `json:"p99Ms"`
}
