package statusapi

import "time"

// Worker is what a non-gateway node (gateway: false) shows: the gateways of its own cluster it
// probes, whether each answers, and via which one it routes every remote cluster.
type Worker struct {
	// ProbePeriodMs and FailureThreshold are the probes' timing: a gateway is unhealthy after
	// FailureThreshold consecutive unanswered probes, ProbePeriodMs apart.
	ProbePeriodMs    int64           `json:"probePeriodMs"`
	FailureThreshold int             `json:"failureThreshold"`
	Gateways         []WorkerGateway `json:"gateways"`
	Routes           []WorkerRoute   `json:"routes"`
}

// WorkerGateway is one gateway of the node's cluster and its probes.
type WorkerGateway struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	// Probing is false while no prober runs for it yet (it just appeared in the broker state).
	Probing             bool       `json:"probing"`
	Healthy             bool       `json:"healthy"`
	ProbesSent          uint64     `json:"probesSent"`
	ProbesFailed        uint64     `json:"probesFailed"`
	ConsecutiveFailures int        `json:"consecutiveFailures"`
	LastError           string     `json:"lastError,omitempty"`
	LastSuccess         *time.Time `json:"lastSuccess,omitempty"`
	RTTMs               float64    `json:"rttMs,omitempty"`
}

// WorkerRoute is how the node routes one remote cluster.
type WorkerRoute struct {
	Cluster string `json:"cluster"`
	// Via is the local gateway the routes go through, Address its private IP.
	Via     string `json:"via"`
	Address string `json:"address"`
	// Carriers are the local gateways the remote side would connect the pair to, in its order of
	// preference; Via is the first that answers this node's probes.
	Carriers []string `json:"carriers,omitempty"`
	// Reason says why Via is not the first carrier.
	Reason  string   `json:"reason,omitempty"`
	Subnets []string `json:"subnets,omitempty"`
}
