// Package cable defines the interface every cable driver implements and the registry the agent
// picks drivers from by name (in the manner of Submariner's pkg/cable). The agent knows only this
// package; drivers live in sub-packages (cable/wireguard, ...) and register themselves in init.
package cable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
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

// Factory builds a driver for the local node with its settings. It must validate settings and
// return an error naming the bad key and value; it must not touch the host (Init does).
type Factory func(node LocalNode, settings Settings) (Driver, error)

// Registration is everything the rest of Cablemesh knows about a driver, given by the driver
// itself. Only Name and New are required.
type Registration struct {
	// Name is the registry key, the driver's name in policies, the agent config and endpoints.
	Name string
	// New builds the driver.
	New Factory
	// ParseSettings validates the driver's block of the agent config without I/O; errors name
	// the field as "<driver>.<key>" and the value. nil accepts only an empty block.
	ParseSettings func(Settings) error
	// ValidateOptions validates the per-connection options a policy gives the driver
	// (cableDriver.options); errors name the option and the value. nil accepts only none.
	ValidateOptions func(Options) error
	// CheckPublished validates what a remote node published for this driver
	// (cable_attributes[driver]); an endpoint that fails it cannot carry the driver. nil accepts
	// anything.
	CheckPublished func(attrs map[string]string) error
	// PrepareProcess, when set, runs first thing in the agent's main, before anything else, for
	// drivers that need the process set up in a way only a re-execution can give (wireguard's
	// private mount namespace for its UAPI sockets). It reports parentDone with the exit code
	// when the process only waited for its re-executed child, which then did the work.
	PrepareProcess func() (parentDone bool, exitCode int, err error)
	// OptIn drivers run only where the agent config names them in cableDrivers: they need
	// kernel support many nodes lack (vxlan+ipsec needs ESP in the kernel), and a default that
	// fails on those nodes would only be noise in every gateway's status.
	OptIn bool
}

var (
	mu            sync.RWMutex
	registrations = map[string]Registration{}
)

// Register adds a driver. It panics on a duplicate or empty name or a missing factory: those
// are programming errors caught at init.
func Register(r Registration) {
	mu.Lock()
	defer mu.Unlock()
	if r.Name == "" || r.New == nil {
		panic(fmt.Sprintf("cable: driver registration %q without a name or a factory", r.Name))
	}
	if _, dup := registrations[r.Name]; dup {
		panic(fmt.Sprintf("cable: driver %q registered twice", r.Name))
	}
	registrations[r.Name] = r
}

// Lookup returns the registration of name.
func Lookup(name string) (Registration, bool) {
	mu.RLock()
	defer mu.RUnlock()
	r, ok := registrations[name]
	return r, ok
}

func lookup(name string) (Registration, error) {
	r, ok := Lookup(name)
	if !ok {
		return Registration{}, fmt.Errorf("cable driver %q is not registered (have %v)", name, Names())
	}
	return r, nil
}

// New builds the driver registered under name.
func New(name string, node LocalNode, settings Settings) (Driver, error) {
	r, err := lookup(name)
	if err != nil {
		return nil, err
	}
	return r.New(node, settings)
}

// ParseSettings validates settings for driver name (see Registration.ParseSettings).
func ParseSettings(name string, s Settings) error {
	r, err := lookup(name)
	if err != nil {
		return err
	}
	if r.ParseSettings == nil {
		for k, v := range s {
			return fmt.Errorf("%s.%s: %q: the %s driver takes no settings", name, k, v, name)
		}
		return nil
	}
	return r.ParseSettings(s)
}

// ValidateOptions validates per-connection options for driver name (see
// Registration.ValidateOptions).
func ValidateOptions(name string, o Options) error {
	r, err := lookup(name)
	if err != nil {
		return err
	}
	if r.ValidateOptions == nil {
		for k, v := range o {
			return fmt.Errorf("%s option %s=%q: unknown key (the %s driver takes no per-connection options)", name, k, v, name)
		}
		return nil
	}
	return r.ValidateOptions(o)
}

// CheckPublished validates a remote node's attributes for driver name (see
// Registration.CheckPublished). An unregistered driver is an error.
func CheckPublished(name string, attrs map[string]string) error {
	r, err := lookup(name)
	if err != nil {
		return err
	}
	if r.CheckPublished == nil {
		return nil
	}
	return r.CheckPublished(attrs)
}

// Names lists the registered drivers, sorted.
func Names() []string {
	mu.RLock()
	defer mu.RUnlock()
	names := make([]string, 0, len(registrations))
	for n := range registrations {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DefaultNames are the registered drivers an agent runs when its config does not list
// cableDrivers: every driver but the opt-in ones, sorted.
func DefaultNames() []string {
	mu.RLock()
	defer mu.RUnlock()
	var names []string
	for n, r := range registrations {
		if !r.OptIn {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// PrepareProcess runs every registered driver's PrepareProcess hook, in name order, and stops at
// the first that reports parentDone (main must then exit with exitCode) or fails.
func PrepareProcess() (parentDone bool, exitCode int, err error) {
	for _, name := range Names() {
		r, _ := Lookup(name)
		if r.PrepareProcess == nil {
			continue
		}
		done, code, err := r.PrepareProcess()
		if err != nil {
			return false, 0, fmt.Errorf("prepare the process for cable driver %s: %w", name, err)
		}
		if done {
			return true, code, nil
		}
	}
	return false, 0, nil
}
