// Package vxlanipsec is the "vxlan+ipsec" cable driver: the combined cable of Submariner's connectivity proposal, VXLAN
// protected by IPsec in transport mode between the two gateways. It composes the two drivers:
//
//   - a VXLAN datapath of cable/vxlan (vxlan.NewEmbedded) with links of its own (cbl-vi<vni>),
//     its own UDP port (4799), the source port pinned to that port, an MTU lowered by ESP's
//     overhead, and its state in StateDir/vxlan+ipsec;
//   - a charon of its own from cable/ipsec (ipsec.NewEmbedded, StateDir/vxlan+ipsec/), on IKE
//     ports of its own (4510/4500), holding one transport-mode connection per remote cluster whose
//     traffic selectors are exactly that pair's VXLAN packets: UDP between the two underlay
//     addresses, from the local VXLAN port to the remote's and back. ESP without UDP
//     encapsulation, AES-GCM;
//   - a guard (guard.go): xfrm block policies that drop the pair's VXLAN packets whenever
//     charon's transport policies are not in place, so nothing crosses in the clear.
//
// Transport mode needs ESP in the kernel: kernel-libipsec, the ipsec driver's fallback where the
// kernel has none, has only tunnel mode. On such a kernel Init fails, saying so, and the agent
// reports the driver unavailable and every pair a policy puts on it in state error with that
// reason.
//
// A node publishes the IKE port as cable_ports["vxlan+ipsec"] and its VXLAN port as the
// attribute vxlanPort. Per-pair options: vni, mtu (the VXLAN link's), ikeProposals, espProposals
// (AEAD only).
//
// Connect: guard, then charon's connection, then the VXLAN entries; Disconnect the reverse.
// Status is the VXLAN connection's judged together with the IPsec one (status.go): connected
// only when both are.
package vxlanipsec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/cable/vxlan"
)

func init() {
	cable.Register(cable.Registration{Name: Name, New: cable.Constructor(NewDriver)})
}

// Driver is the vxlan+ipsec cable driver. Its methods are safe for concurrent use.
type Driver struct {
	node cable.LocalNode
	cfg  config
	log  *slog.Logger
	vx   *vxlan.Driver
	sec  *ipsec.Driver
	// hasESP probes the kernel (ipsec.KernelHasESP; tests replace it).
	hasESP func() (bool, error)

	mu          sync.Mutex
	initialised bool
}

// NewDriver validates settings and builds the driver; it touches nothing until Init (the
// registry builds through cable.Constructor(NewDriver)).
func NewDriver(node cable.LocalNode, settings cable.Settings) (*Driver, error) {
	cfg, err := parseSettings(settings)
	if err != nil {
		return nil, err
	}
	vx, err := vxlan.NewEmbedded(node, cfg.VXLAN, vxlan.Embedding{Name: Name, PinSourcePort: true, ExtraOverhead: ESPTransportOverhead})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	sec, err := ipsec.NewEmbedded(node, cfg.IPsec, ipsec.Transport{Name: Name, Proto: "udp"})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	return &Driver{node: node, cfg: cfg, log: node.Logger(Name), vx: vx, sec: sec, hasESP: ipsec.KernelHasESP}, nil
}

func (d *Driver) Name() string { return Name }

// ErrNoKernelESP is why Init fails on a kernel without ESP (wrapped, with the probe's answer).
var ErrNoKernelESP = errors.New("vxlan+ipsec needs ESP in the kernel for its transport-mode SAs, and this kernel has none; " +
	"kernel-libipsec (the ipsec driver's fallback here) has no transport mode. Put the pair on the ipsec or wireguard driver, " +
	"or run a kernel with esp4 and xfrm_user")

// Init checks that the kernel holds ESP SAs, then starts (or adopts) the charon and readies the
// VXLAN datapath.
func (d *Driver) Init(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.initialised {
		return nil
	}
	ok, err := d.hasESP()
	if !ok {
		if err != nil {
			return fmt.Errorf("%s init: %w (probe: %v)", Name, ErrNoKernelESP, err)
		}
		return fmt.Errorf("%s init: %w", Name, ErrNoKernelESP)
	}
	if err := d.sec.Init(ctx); err != nil {
		// A bad setting (the charon binary) is ours: name it as the operator wrote it.
		if se := (*cable.SettingError)(nil); errors.As(err, &se) {
			return rename(se, map[string]string{"port": keyIKEPort})
		}
		return fmt.Errorf("%s init: %w", Name, err)
	}
	if err := d.vx.Init(ctx); err != nil {
		_ = d.sec.Close()
		return fmt.Errorf("%s init: %w", Name, err)
	}
	d.initialised = true
	d.log.Info("vxlan+ipsec ready", "vxlanPort", d.cfg.VXLANPort, "ikePort", d.sec.LocalEndpoint().Port, "mtu", d.vx.MTU(), "datapath", d.sec.Datapath())
	return nil
}

// LocalEndpoint publishes the IKE port and, as an attribute, the VXLAN port.
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	return cable.LocalEndpoint{Port: d.sec.LocalEndpoint().Port, Attributes: map[string]string{AttrVXLANPort: strconv.Itoa(d.cfg.VXLANPort)}}
}

// Links are the VXLAN links: the inner packets' route MTU is theirs, and the MSS clamp goes there.
func (d *Driver) Links() []string { return d.vx.Links() }

// MTU is the VXLAN links' MTU (valid after Init).
func (d *Driver) MTU() int { return d.vx.MTU() }

// Connect installs the pair's guard, then the transport-mode connection in charon, then the
// VXLAN entries and routes. The order means the VXLAN packets have a policy, charon's or the
// guard's dropping them, before the first one is sent.
func (d *Driver) Connect(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options) error {
	where := Name + " connect to cluster " + remote.Cluster
	o, err := parseOptions(opts)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := cable.CheckRemote(Name, remote); err != nil {
		return err
	}
	rport, err := remoteVXLANPort(remote.Attributes)
	if err != nil {
		return fmt.Errorf("%s: remote endpoint %s: %w", where, remote.Node, err)
	}
	local, ra := d.node.AdvertiseAddress.Unmap(), remote.Address.Unmap()
	if !local.Is4() || !ra.Is4() {
		return fmt.Errorf("%s: underlay addresses %s and %s: the VXLAN cable is IPv4 only", where, local, ra)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	lport := uint16(d.cfg.VXLANPort)
	old, err := d.remoteAddr(ctx, remote.Cluster)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if old.IsValid() && old != ra {
		// The remote gateway moved: its old address's guard goes with its connection.
		if err := removeGuards(old); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	if err := ensureGuard(local, ra, lport, rport); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := d.sec.ConnectTransport(ctx, remote, o.IPsec, ipsec.TransportPorts{Local: lport, Remote: rport}); err != nil {
		return fmt.Errorf("%s: IPsec: %w", where, err)
	}
	vr := remote
	vr.Port = rport // the VXLAN packets go to the remote's VXLAN port
	if err := d.vx.Connect(ctx, vr, o.VXLAN); err != nil {
		return fmt.Errorf("%s: VXLAN: %w", where, err)
	}
	return nil
}

// Disconnect removes the VXLAN entries first (no more packets), then the IPsec connection, then
// the guard. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	where := Name + " disconnect cluster " + cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	// The VXLAN connection knows the remote's address also after an agent restart
	// (connections.json): read it before the connection goes.
	ra, err := d.remoteAddr(ctx, cluster)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	errs := []error{d.vx.Disconnect(ctx, cluster), d.sec.Disconnect(ctx, cluster)}
	if ra.IsValid() {
		errs = append(errs, removeGuards(ra))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// Connections reports one entry per VXLAN connection, judged with its IPsec connection and
// guard (see combine).
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return nil, cable.NotInitialised(Name + " connections")
	}
	vs, err := d.vx.Connections(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s connections: %w", Name, err)
	}
	ss, err := d.sec.Connections(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s connections: %w", Name, err)
	}
	guards := map[string]map[string]bool{}
	for _, v := range vs {
		ap, err := netip.ParseAddrPort(v.Endpoint)
		if err != nil || v.Cluster == "" {
			continue // combine reports it
		}
		g, err := guardsOf(ap.Addr())
		if err != nil {
			return nil, fmt.Errorf("%s connections: %w", Name, err)
		}
		guards[v.Cluster] = g
	}
	return combine(vs, ss, guards), nil
}

// remoteAddr is the underlay address of cluster's VXLAN connection, invalid when there is none.
// Called with d.mu held.
func (d *Driver) remoteAddr(ctx context.Context, cluster string) (netip.Addr, error) {
	vs, err := d.vx.Connections(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, v := range vs {
		if v.Cluster == cluster {
			if ap, err := netip.ParseAddrPort(v.Endpoint); err == nil {
				return ap.Addr(), nil
			}
		}
	}
	return netip.Addr{}, nil
}

// Cleanup removes everything: the VXLAN links and routes, the charon with its SAs and
// policies, every guard policy of ours, and the state directory.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.initialised = false
	errs := []error{d.vx.Cleanup(ctx), d.sec.Cleanup(ctx), removeGuards(netip.Addr{})}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s cleanup: %w", Name, err)
	}
	d.log.Info("cleaned up")
	return nil
}

// Close stops the driver's goroutines (the embedded charon's supervision) and leaves the host
// as it is: the VXLAN links, charon with its SAs, and the guards outlive an agent restart.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.initialised = false
	return errors.Join(d.vx.Close(), d.sec.Close())
}

// StopProcesses ends the embedded charon (cable.ProcessOwner).
func (d *Driver) StopProcesses(ctx context.Context) error { return d.sec.StopProcesses(ctx) }

// Helpers reports the embedded charon (cable.HelperReporter), without waiting for d.mu.
func (d *Driver) Helpers(ctx context.Context) []cable.HelperStatus { return d.sec.Helpers(ctx) }
