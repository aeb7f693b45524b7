package dashboard

import (
	"time"

	"github.com/cablemesh/cablemesh/policy"
)

// Mesh is the document behind every page and GET /api/v1/mesh. clusters, links, policies and
// services are the contract; the other keys are the dashboard's own (pairs: one verdict per
// cluster pair for the matrix; events: what changed lately).
type Mesh struct {
	// GeneratedAt is when the dashboard last asked the broker.
	GeneratedAt time.Time `json:"generatedAt"`
	// Revision is the broker's store revision the document was built at.
	Revision uint64 `json:"revision"`
	// Error says why the last poll of the broker failed; the rest is then what it last saw.
	Error    string    `json:"error,omitempty"`
	Clusters []Cluster `json:"clusters"`
	// Links are the link reports' pairs, as `cablectl links --all -o json` lists them.
	Links    []Link    `json:"links"`
	Pairs    []Pair    `json:"pairs"`
	Policies []Policy  `json:"policies"`
	Services []Service `json:"services"`
	// Warnings are mesh-wide: the CAs and the admin certificate this dashboard uses.
	Warnings []string `json:"warnings"`
	Events   []Event  `json:"events"`
}

// Cluster is one member of the mesh with its gateways.
type Cluster struct {
	Name   string            `json:"name"`
	ID     uint32            `json:"id"`
	Labels map[string]string `json:"labels"`
	// Mode is direct or gateway (policy.ModeDirect, policy.ModeGateway).
	Mode           string    `json:"mode"`
	GatewaysOnline int       `json:"gatewaysOnline"`
	GatewaysTotal  int       `json:"gatewaysTotal"`
	Gateways       []Gateway `json:"gateways"`
	// AgentVersions are the distinct versions its gateways' agents report.
	AgentVersions []string `json:"agentVersions"`
	// CertWarnings name the nodes whose certificate expired, expires within CertWarnBefore or
	// comes from a CA the broker stops trusting.
	CertWarnings []string `json:"certWarnings"`
}

// Gateway is one gateway node: registered with a running lease (online), or known from its
// certificate record (the broker keeps its mesh address) but not registered now. The lease's
// expiry is left out: it moves on every heartbeat, and the page would redraw for nothing.
type Gateway struct {
	Node         string     `json:"node"`
	Online       bool       `json:"online"`
	PrivateIP    string     `json:"privateIP,omitempty"`
	MeshAddress  string     `json:"meshAddress,omitempty"`
	AgentVersion string     `json:"agentVersion,omitempty"`
	CertNotAfter *time.Time `json:"certNotAfter,omitempty"`
}

// Link is one cluster pair as the broker's link reports have it: both ends' view.
type Link struct {
	Clusters [2]string `json:"clusters"`
	Ends     []LinkEnd `json:"ends"`
	Agree    bool      `json:"agree"`
	Stale    bool      `json:"stale"`
}

// LinkEnd is what one end's gateway reported of the pair.
type LinkEnd struct {
	Cluster       string     `json:"cluster"`
	Node          string     `json:"node"`
	State         string     `json:"state"`
	Driver        string     `json:"driver"`
	Policy        string     `json:"policy"`
	LatencyP50Ms  *float64   `json:"latencyP50Ms"`
	LatencyP95Ms  *float64   `json:"latencyP95Ms"`
	LatencyP99Ms  *float64   `json:"latencyP99Ms"`
	LastHandshake *time.Time `json:"lastHandshake"`
	ReportedAt    *time.Time `json:"reportedAt"`
	AgentVersion  string     `json:"agentVersion"`
	// Stale: this end's report is older than the broker's bound (its gateway stopped reporting);
	// its state is then what it said last. Not in the JSON, whose keys are links --all's.
	Stale bool `json:"-"`
}

// Pair states, the matrix's colours.
const (
	StateConnected = "connected" // every reporting end is connected and the ends agree
	StateDegraded  = "degraded"  // up at some end, but the ends disagree, one is missing or stale
	StateDown      = "down"      // an end reports an error, or a cluster has no gateway online
	StateUnknown   = "unknown"   // the policy connects the pair and nobody reported it yet
	StateNone      = "none"      // the policies do not connect the pair
)

// Pair is the dashboard's verdict on one cluster pair, from the policy decision, the gateways the
// broker holds and the link report.
type Pair struct {
	Clusters [2]string `json:"clusters"`
	State    string    `json:"state"`
	// Reason says, in words, why State.
	Reason  string `json:"reason"`
	Connect bool   `json:"connect"`
	// Driver: the reported driver where an end reports one, else the policy's.
	Driver       string   `json:"driver,omitempty"`
	Policy       string   `json:"policy,omitempty"`
	LatencyP50Ms *float64 `json:"latencyP50Ms,omitempty"`
	LatencyP99Ms *float64 `json:"latencyP99Ms,omitempty"`
	// Nodes: the gateway node serving the pair at each end that reports it, "cluster/node".
	Nodes []string `json:"nodes,omitempty"`
}

// Policy is one connection policy with the pairs it decides and loses.
type Policy struct {
	Name string `json:"name"`
	// Origin is "mesh" or "cluster/<name>" (the cluster that applied it).
	Origin    string        `json:"origin"`
	Priority  int           `json:"priority"`
	IsDefault bool          `json:"isDefault"`
	Spec      policy.Spec   `json:"spec"`
	Status    policy.Status `json:"status"`
	// Decides lists the pairs it decided; Loses the pairs it covered with the outcome that left
	// it out. Each holds at most MaxPairsListed; Truncated says when more were left out.
	Decides   []PairOutcome `json:"decides"`
	Loses     []PairOutcome `json:"loses"`
	Truncated bool          `json:"truncated,omitempty"`
}

// PairOutcome is what became of one policy on one pair (policy.Candidate's outcome).
type PairOutcome struct {
	Clusters [2]string `json:"clusters"`
	Outcome  string    `json:"outcome"`
	// Winner is the policy that decided the pair.
	Winner  string `json:"winner"`
	Connect bool   `json:"connect"`
	Driver  string `json:"driver,omitempty"`
}

// Service is one service import (the merge of its clusters' exports).
type Service struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Type      string        `json:"type"`
	VIPs      []string      `json:"vips"`
	Ports     []ServicePort `json:"ports"`
	// Exporters are the clusters whose export is part of the import, with their ready endpoints.
	Exporters []Exporter `json:"exporters"`
	// Conflicts are the exports left out of the import, and why.
	Conflicts []ServiceConflict `json:"conflicts"`
}

// ServicePort is one port of a service.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Port     uint32 `json:"port"`
	Protocol string `json:"protocol"`
}

// Exporter is one exporting cluster of a service.
type Exporter struct {
	Cluster        string `json:"cluster"`
	Endpoints      int    `json:"endpoints"`
	ReadyEndpoints int    `json:"readyEndpoints"`
}

// ServiceConflict is an export left out of its service's import.
type ServiceConflict struct {
	Cluster string `json:"cluster"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Event kinds.
const (
	EventPairUp      = "pair-up"
	EventPairDown    = "pair-down"
	EventPairChanged = "pair-changed" // another non-up, non-down transition (degraded, unknown)
	EventFailover    = "failover"     // the gateway serving a pair at one end changed
	EventPolicy      = "policy"       // a policy was added, changed or removed
	EventCluster     = "cluster"      // a cluster joined or left, a gateway came or went
	EventBroker      = "broker"       // the broker stopped or started answering
)

// Event is one change the dashboard saw between two successive states of the mesh.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Subject string    `json:"subject"`
	Message string    `json:"message"`
}
