// Package cable defines the interface every cable driver implements and the registry the agent
// picks drivers from by name (in the manner of Submariner's pkg/cable). The agent knows only this
// package; drivers live in sub-packages (cable/wireguard, ...) and register themselves in init.
//
// A driver comes in two halves. Its spec (cable/<driver>/spec) is pure: the settings and options
// it takes, what it publishes, its traits; it registers a Spec (RegisterSpec), and the broker,
// the policy resolver and cablectl link only the specs (cable/specs). Its datapath
// (cable/<driver>) changes the host; it registers the constructor (Register), and only the agent
// links it (cable/drivers).
package cable

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sort"
	"time"
)

// ErrNotInitialised is returned (wrapped) by Connect, Disconnect and Connections of a driver
// whose Init has not succeeded.
var ErrNotInitialised = errors.New("cable driver is not initialised")

// LocalNode describes the node a driver runs on.
type LocalNode struct {
	Cluster string
	Node    string
	// StateDir is the agent's state directory; a driver keeps its persistent files (keys) under
	// StateDir/<driver name>/.
	StateDir string
	// AdvertiseAddress is the underlay address remote gateways reach this node at.
	AdvertiseAddress netip.Addr
	// LocalSubnets are the pod (and service) CIDRs behind this node. A driver uses an address of
	// this node inside them as the source of the routes it installs, so that traffic the gateway
	// itself originates is accepted by the remote end (whose allowed sources are these subnets).
	LocalSubnets []netip.Prefix
	// Log is the logger the driver logs through (the agent's, with the node's identity); nil
	// means slog.Default().
	Log *slog.Logger
}

// Settings are a driver's node-level settings: its own block of the agent config (the YAML mapping
// under the driver's name, e.g. `wireguard: {interface: cbl-wg0, port: 51820}`), each value in its
// scalar text form. Only the driver knows its keys: it validates them (Registration.ParseSettings)
// and fills its defaults. Unknown keys are an error.
type Settings map[string]string

// Options are the per-connection options a ClusterConnectionPolicy gives (cableDriver.options).
type Options map[string]string

// RemoteEndpoint is the remote gateway a connection goes to.
type RemoteEndpoint struct {
	Cluster   string
	ClusterID uint32
	Node      string
	// Address is the remote gateway's underlay address and Port its port for this driver.
	Address netip.Addr
	Port    uint16
	// Attributes are what the remote node published for this driver beyond its port (its
	// endpoint's cable_attributes[driver]), e.g. the WireGuard public key. Their keys are the
	// driver's own (LocalEndpoint.Attributes on the remote node).
	Attributes map[string]string
	// Subnets are the remote cluster's CIDRs: what the connection carries and what gets routed.
	// For a gateway-mode pair it is only the remote gateway's mesh address (a /32).
	Subnets []netip.Prefix
	// LocalSubnets, when set, replace LocalNode.LocalSubnets for this one connection: the route
	// source is picked inside them and the ipsec driver uses them as the local traffic
	// selectors. A gateway-mode pair sets them to this gateway's own mesh address (a /32), so
	// the connection carries only the two gateways' mesh addresses, never a pod IP of either
	// side. Empty means LocalNode.LocalSubnets, as for every direct pair.
	LocalSubnets []netip.Prefix
	// PreSharedKey is the secret of this cluster pair, derived by the broker from the mesh secret
	// and delivered only to the pair's two clusters (used by the ipsec driver). Never log it.
	PreSharedKey []byte
}

// SourceSubnets are the local subnets of the connection to r: r.LocalSubnets when set, else
// the node's (LocalNode.LocalSubnets). Drivers pick the route source (and ipsec its local traffic
// selectors) inside them.
func (r RemoteEndpoint) SourceSubnets(node LocalNode) []netip.Prefix {
	if len(r.LocalSubnets) > 0 {
		return r.LocalSubnets
	}
	return node.LocalSubnets
}

// State of one connection, as observed on the host (never what the agent merely intended).
type State string

const (
	StateConnected  State = "connected"
	StateConnecting State = "connecting"
	StateError      State = "error"
)

// ConnectionStatus is one connection as the driver observes it on the device.
type ConnectionStatus struct {
	Cluster       string
	Node          string
	Endpoint      string // remote address:port
	State         State
	Message       string
	RxBytes       uint64
	TxBytes       uint64
	LastHandshake time.Time // zero when the driver has none or there was none yet
	MTU           int
	Subnets       []netip.Prefix
}

// SortConnections orders connection reports by cluster, then endpoint, so every driver reports in
// the same stable order (status output and tests compare them).
func SortConnections(cs []ConnectionStatus) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Cluster != cs[j].Cluster {
			return cs[i].Cluster < cs[j].Cluster
		}
		return cs[i].Endpoint < cs[j].Endpoint
	})
}

// LocalEndpoint is what this node publishes for a driver in its broker Endpoint record: its port
// (cable_ports[driver]) and any other attributes remote ends need (cable_attributes[driver]),
// e.g. {"publicKey": "<base64>"} for wireguard.
type LocalEndpoint struct {
	Port       uint16
	Attributes map[string]string
}

// Driver is one kind of cable. All methods must be idempotent: calling Connect twice with the same
// arguments changes nothing on the host.
type Driver interface {
	// Name is the registry key, e.g. "wireguard".
	Name() string
	// Init prepares the node: devices, keys, helper processes. Called once before any Connect.
	Init(ctx context.Context) error
	// LocalEndpoint returns what this node publishes for the driver (valid after Init).
	LocalEndpoint() LocalEndpoint
	// Links names the network links the driver's tunnelled traffic leaves through, as interface
	// matches: an exact name ("wg-east"), or a prefix ending in '*' ("cbl-vx*"). The agent clamps
	// the TCP MSS of traffic leaving through them. Valid after Init; may be empty (a datapath
	// without a link of its own).
	Links() []string
	// Connect creates or updates the connection to remote.Cluster (one connection per remote
	// cluster), including the routes to remote.Subnets over this cable.
	Connect(ctx context.Context, remote RemoteEndpoint, opts Options) error
	// Disconnect removes the connection to a cluster and its routes. Unknown clusters are no error.
	Disconnect(ctx context.Context, cluster string) error
	// Connections reports every connection the driver has on the host, read from the device.
	Connections(ctx context.Context) ([]ConnectionStatus, error)
	// Cleanup removes every link, route, socket and file (except persistent keys) the driver made.
	Cleanup(ctx context.Context) error
	// Close stops everything the driver runs in this process (goroutines, sockets) and releases
	// its handles. It leaves host state that outlives the process in place (kernel links, routes,
	// SAs), so an agent restart does not flap tunnels; a helper daemon that holds host state
	// (ipsec's charon) counts as host state: Close leaves it running for the next Init to adopt,
	// Cleanup stops it. What cannot outlive the process (an in-process userspace device) ends with
	// it. Close after Cleanup is
	// allowed; nothing may be called after Close.
	Close() error
}

// ProcessOwner is a driver whose Close leaves a helper daemon running for the next Init to adopt
// (ipsec's charon). The next agent can adopt it only if it sees the process: where it runs in
// another PID namespace (a DaemonSet's next pod, taking the node over from a running one: see
// agent/handover), the stopping agent ends the daemon itself, so that the next one's can bind
// its ports and devices.
type ProcessOwner interface {
	// StopProcesses ends the daemons the driver left running; it may be called after Close.
	StopProcesses(ctx context.Context) error
}
