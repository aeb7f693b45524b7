// Package fakedriver is an in-memory cable.Driver for agent tests: it records every call and
// reports the connections it holds as a device would.
package fakedriver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Call is one recorded mutating call.
type Call struct {
	Op      string // connect | disconnect | init | cleanup | close
	Cluster string
	Remote  cable.RemoteEndpoint
	Options cable.Options
	Driver  string // the driver's name
	At      time.Time
}

// Driver is the fake.
type Driver struct {
	mu          sync.Mutex
	conns       map[string]cable.RemoteEndpoint
	calls       []Call
	State       cable.State // reported state of every connection; default connected
	ObserveErr  error       // returned by Connections when set
	ConnectErr  error       // returned by Connect when set
	InitErr     error       // returned by Init when set
	DriverName  string      // Name(); default wireguard
	Handshake   time.Time
	Port        uint16
	Key         string
	LinkNames   []string // Links(); default fake-<name>
	initialized bool
}

// New returns an empty fake named wireguard whose connections report connected.
func New() *Driver {
	return &Driver{conns: map[string]cable.RemoteEndpoint{}, State: cable.StateConnected, Port: 51820, Key: "bG9jYWwta2V5LWxvY2FsLWtleS1sb2NhbC1rZXktMDA=", DriverName: "wireguard"}
}

// NewNamed returns an empty fake registered under name, publishing port.
func NewNamed(name string, port uint16) *Driver {
	d := New()
	d.DriverName, d.Port = name, port
	if name != "wireguard" {
		d.Key = ""
	}
	return d
}

func (d *Driver) Name() string { return d.DriverName }

func (d *Driver) Init(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, Call{Op: "init", Driver: d.DriverName, At: time.Now()})
	if d.InitErr != nil {
		return d.InitErr
	}
	d.initialized = true
	return nil
}

func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	le := cable.LocalEndpoint{Port: d.Port}
	if d.Key != "" {
		le.Attributes = map[string]string{"publicKey": d.Key}
	}
	return le
}

// Links are LinkNames, or fake-<name>.
func (d *Driver) Links() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.LinkNames != nil {
		return slices.Clone(d.LinkNames)
	}
	return []string{"fake-" + d.DriverName}
}

// Close records the call.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, Call{Op: "close", Driver: d.DriverName, At: time.Now()})
	d.initialized = false
	return nil
}

func (d *Driver) Connect(_ context.Context, r cable.RemoteEndpoint, opts cable.Options) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialized {
		return errors.New("fakedriver: Connect before Init")
	}
	if d.ConnectErr != nil {
		return d.ConnectErr
	}
	r.Subnets = slices.Clone(r.Subnets)
	d.conns[r.Cluster] = r
	d.calls = append(d.calls, Call{Op: "connect", Cluster: r.Cluster, Remote: r, Options: opts, Driver: d.DriverName, At: time.Now()})
	return nil
}

func (d *Driver) Disconnect(_ context.Context, cluster string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.conns, cluster)
	d.calls = append(d.calls, Call{Op: "disconnect", Cluster: cluster, Driver: d.DriverName, At: time.Now()})
	return nil
}

func (d *Driver) Connections(context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ObserveErr != nil {
		return nil, d.ObserveErr
	}
	out := make([]cable.ConnectionStatus, 0, len(d.conns))
	for _, r := range d.conns {
		out = append(out, cable.ConnectionStatus{
			Cluster:       r.Cluster,
			Node:          r.Node,
			Endpoint:      netip.AddrPortFrom(r.Address, r.Port).String(),
			State:         d.State,
			RxBytes:       1234,
			TxBytes:       5678,
			LastHandshake: d.Handshake,
			MTU:           1420,
			Subnets:       slices.Clone(r.Subnets),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out, nil
}

func (d *Driver) Cleanup(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conns = map[string]cable.RemoteEndpoint{}
	d.calls = append(d.calls, Call{Op: "cleanup", Driver: d.DriverName, At: time.Now()})
	return nil
}

// Calls returns the recorded calls (Connect, Disconnect, Init, Cleanup, Close) and clears the
// record.
func (d *Driver) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.calls
	d.calls = nil
	return c
}

// Has reports whether the fake holds a connection to cluster.
func (d *Driver) Has(cluster string) (cable.RemoteEndpoint, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.conns[cluster]
	return r, ok
}

// Clusters lists the clusters the fake holds connections to, sorted.
func (d *Driver) Clusters() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.conns))
	for c := range d.conns {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// Put adds a connection behind the agent's back, as a previous run would have left it.
func (d *Driver) Put(r cable.RemoteEndpoint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conns[r.Cluster] = r
}

// Remove drops a connection behind the agent's back, as drift on the host would.
func (d *Driver) Remove(cluster string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.conns, cluster)
}

func (c Call) String() string { return fmt.Sprintf("%s %s", c.Op, c.Cluster) }

// SetInitErr sets what Init returns from now on (nil: it succeeds), while the driver may be in use.
func (d *Driver) SetInitErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.InitErr = err
}

// SetHandshake sets the last handshake every connection reports.
func (d *Driver) SetHandshake(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Handshake = t
}

// RegisterFakes registers, for every name not registered yet, a registration whose factory builds
// a fake, so that planner and agent tests run without the real drivers. As the real wireguard
// driver does, a fake "wireguard" endpoint must publish a non-empty "publicKey".
func RegisterFakes(names ...string) {
	for _, name := range names {
		if _, ok := cable.Lookup(name); ok {
			continue
		}
		r := cable.Registration{
			Name: name,
			New:  func(cable.LocalNode, cable.Settings) (cable.Driver, error) { return NewNamed(name, 1), nil },
		}
		if name == "wireguard" {
			r.CheckPublished = func(attrs map[string]string) error {
				if attrs["publicKey"] == "" {
					return errors.New("publishes no wireguard key")
				}
				return nil
			}
		}
		cable.Register(r)
	}
}
