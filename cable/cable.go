// Package cable defines the interface every cable driver implements and the registry the agent
// picks drivers from by name (in the manner of Submariner's pkg/cable). The agent knows only this
// package; drivers live in sub-packages (cable/wireguard, ...) and register themselves in init.
package cable

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"
)

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
}

// Settings are a driver's node-level settings from the agent config, e.g. for wireguard
// {"interface": "cbl-wg0", "port": "51820"}. Unknown keys are an error.
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
	// PublicKey is the remote node's WireGuard public key (base64), for drivers that need one.
	PublicKey string
	// Subnets are the remote cluster's CIDRs: what the connection carries and what gets routed.
	Subnets []netip.Prefix
	// PreSharedKey is the secret of this cluster pair, derived by the broker from the mesh secret
	// and delivered only to the pair's two clusters (used by the ipsec driver). Never log it.
	PreSharedKey []byte
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

// LocalEndpoint is what this node publishes for a driver in its broker Endpoint record.
type LocalEndpoint struct {
	Port      uint16
	PublicKey string
}

// Driver is one kind of cable. All methods must be idempotent: calling Connect twice with the same
// arguments changes nothing on the host.
type Driver interface {
	// Name is the registry key, e.g. "wireguard".
	Name() string
	// Init prepares the node: devices, keys. Called once before any Connect.
	Init(ctx context.Context) error
	// LocalEndpoint returns what this node publishes for the driver (valid after Init).
	LocalEndpoint() LocalEndpoint
	// Connect creates or updates the connection to remote.Cluster (one connection per remote
	// cluster), including the routes to remote.Subnets over this cable.
	Connect(ctx context.Context, remote RemoteEndpoint, opts Options) error
	// Disconnect removes the connection to a cluster and its routes. Unknown clusters are no error.
	Disconnect(ctx context.Context, cluster string) error
	// Connections reports every connection the driver has on the host, read from the device.
	Connections(ctx context.Context) ([]ConnectionStatus, error)
	// Cleanup removes every link, route, socket and file (except persistent keys) the driver made.
	Cleanup(ctx context.Context) error
}

// Factory builds a driver for the local node with its settings. It must validate settings and
// return an error naming the bad key and value.
type Factory func(node LocalNode, settings Settings) (Driver, error)

var (
	mu        sync.RWMutex
	factories = map[string]Factory{}
)

// Register adds a driver factory under name. It panics on a duplicate name: that is a programming
// error caught at init.
func Register(name string, f Factory) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := factories[name]; dup {
		panic(fmt.Sprintf("cable: driver %q registered twice", name))
	}
	factories[name] = f
}

// New builds the driver registered under name.
func New(name string, node LocalNode, settings Settings) (Driver, error) {
	mu.RLock()
	f, ok := factories[name]
	mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("cable driver %q is not registered (have %v)", name, Names())
	}
	return f(node, settings)
}

// Names lists the registered drivers, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	names := make([]string, 0, len(factories))
	for n := range factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
