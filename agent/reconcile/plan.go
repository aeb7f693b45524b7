// Package reconcile turns the broker's state into cable connections. The planner (Desired, Plan)
// is pure: it reads broker records, the connection policies' decisions and what the drivers
// observed, and returns actions. The applier (Reconciler) is the thin part that calls the
// drivers.
package reconcile

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/policy"
)

// DefaultDriver is the driver of the mesh's default policy when the broker sends no policies at
// all (a broker older than policies): full mesh over WireGuard, as before policies existed.
const DefaultDriver = policy.DefaultDriver

// Problem is a remote cluster the planner had to skip or trim, with the reason (logged, shown in
// status). Driver and Policy are those the decision named, when there is one. Partial is set when
// the pair still connects and the problem is about a part of it (a subnet left out).
type Problem struct {
	Cluster string
	Driver  string
	Policy  string
	Message string
	Partial bool
}

// Guard is what no cable route may cover: the addresses this node must keep reaching over its
// underlay (the broker's, its own advertise address) and its underlay network. A remote subnet
// that overlaps one of them is left out of its pair's connection (the pair's other subnets are
// still routed) and reported as a Partial problem; so is one that covers a gateway's address
// (every endpoint's private and public IP in the broker state, which Desired reads itself) or
// overlaps the loopback, link-local, multicast or unspecified ranges (validation.CheckClusterCIDR).
// A pair left with no subnet at all is not connected. The zero Guard protects the gateways and
// those ranges only.
type Guard struct {
	Protected []Protected
}

// Protected is one address (a /32 or /128 prefix) or network no cable route may overlap, and what
// it is, for messages: "the broker's address 10.0.0.1", "this node's underlay network
// 10.0.0.0/24".
type Protected struct {
	Prefix netip.Prefix
	What   string
}

// ProtectAddr is a Protected single address.
func ProtectAddr(a netip.Addr, what string) Protected {
	return Protected{Prefix: netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), What: what}
}

// refusal says why subnet p must not be routed over a cable ("" when it may be): the first
// protected address or network it overlaps, in the order given.
func refusal(p netip.Prefix, protected []Protected) string {
	for _, x := range protected {
		if !x.Prefix.IsValid() || !p.Overlaps(x.Prefix) {
			continue
		}
		verb := "overlaps"
		if x.Prefix.IsSingleIP() {
			verb = "covers"
		}
		return fmt.Sprintf("subnet %s is not routed over the cable: it %s %s, which this node must keep reaching over its underlay", p, verb, x.What)
	}
	if err := validation.CheckClusterCIDR("subnet", p); err != nil {
		return fmt.Sprintf("subnet %s is not routed over the cable: %v", p, err)
	}
	return ""
}

// gatewayAddrs are the private and public IPs of every endpoint in st, to protect.
func gatewayAddrs(st *brokerstate.State) []Protected {
	var out []Protected
	for _, k := range slices.Sorted(maps.Keys(st.Endpoints)) {
		e := st.Endpoints[k]
		for _, s := range []string{e.GetPrivateIp(), e.GetPublicIp()} {
			if a, err := netip.ParseAddr(s); err == nil {
				out = append(out, ProtectAddr(a, fmt.Sprintf("the address %s of gateway %s", a.Unmap(), k)))
			}
		}
	}
	return out
}

// Want is one connection this node should have: to Remote over Driver with Options, as Policy
// decided. GatewayMode marks a gateway-mode pair: Remote.Subnets is then only RemoteMesh (a /32)
// and Remote.LocalSubnets only this gateway's own mesh address.
type Want struct {
	Remote      cable.RemoteEndpoint
	Driver      string
	Options     cable.Options
	Policy      string
	GatewayMode bool
	// RemoteMesh is the chosen remote gateway's mesh address (gateway-mode pairs only).
	RemoteMesh netip.Addr
}

// Pair modes as status shows them.
const (
	ModeGateway = policy.ModeGateway
	ModeDirect  = policy.ModeDirect
)

// PairMode is the mode of the pair of clusters local and remote under decision opts: gateway when
// either cluster joined in gateway mode or the policy's options say mode: gateway, else direct.
func PairMode(local, remote *apiv1.Cluster, opts map[string]string) string {
	if local.GetGatewayMode() || remote.GetGatewayMode() || policy.GatewayModeOption(opts) {
		return ModeGateway
	}
	return ModeDirect
}

// MeshAddress parses an endpoint's broker-allocated mesh address (invalid when it has none or
// it is not an IPv4 address: the mesh range is IPv4).
func MeshAddress(e *apiv1.Endpoint) netip.Addr {
	a, err := netip.ParseAddr(e.GetMeshAddress())
	if err != nil || !a.Unmap().Is4() {
		return netip.Addr{}
	}
	return a.Unmap()
}

// PairDecision is the policy decision for one remote cluster with a live endpoint, connected or
// not, so an operator can see why a pair is absent.
type PairDecision struct {
	Cluster string
	Connect bool
	Driver  string
	Policy  string
	Default bool
	// Mode is ModeGateway or ModeDirect (see PairMode).
	Mode string
}

// Drivers are the drivers this node is configured to run: by name, nil when the driver runs, or
// the error that keeps it from running (its Init failed). A driver not in the map is not
// configured on this node.
type Drivers map[string]error

// Resolver builds the policy resolver for st: the mesh's non-default policies and its default
// policy (is_default). With no policy at all (a broker that predates policies) the default is
// full mesh over DefaultDriver, as before. Policies whose JSON cannot be decoded are left out
// and returned as problems (keyed by policy name in Cluster).
func Resolver(st *brokerstate.State) (*policy.Resolver, []Problem) {
	var list []policy.ClusterConnectionPolicy
	def := policy.DefaultPolicy(DefaultDriver)
	var problems []Problem
	names := slices.Sorted(maps.Keys(st.Policies))
	for _, n := range names {
		rec := st.Policies[n]
		p, err := policy.DecodeJSON(rec.GetJson())
		if err != nil {
			problems = append(problems, Problem{Policy: n, Message: fmt.Sprintf("policy %q: cannot decode its JSON: %v", n, err)})
			continue
		}
		if p.Metadata.Name == "" {
			p.Metadata.Name = n
		}
		if rec.GetIsDefault() {
			def = p
			continue
		}
		list = append(list, p)
	}
	return policy.NewResolver(list, def), problems
}

// PolicyKey fingerprints the policies of st: equal keys give equal resolvers, so the agent
// builds a resolver only when a policy changed (labels are inputs of Resolve, not of the
// resolver).
func PolicyKey(st *brokerstate.State) string {
	h := sha256.New()
	for _, n := range slices.Sorted(maps.Keys(st.Policies)) {
		p := st.Policies[n]
		var b [9]byte
		binary.BigEndian.PutUint64(b[:8], uint64(len(p.GetJson())))
		if p.GetIsDefault() {
			b[8] = 1
		}
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(b[:])
		h.Write(p.GetJson())
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Desired returns, for every cluster other than local that has at least one endpoint, the
// decision of the policies (res) for the pair, and for the pairs that connect, the one
// connection this node should have, sorted by cluster name.
//
// The driver is the decision's; the remote endpoint must list it in its drivers (an endpoint
// listing none is from an agent older than multi-driver nodes and is taken to run anything it
// publishes a port for) and publish its port in cable_ports. The endpoint is chosen
// deterministically: the lexically smallest node name among the cluster's endpoints that can
// carry the driver, so every remote agent and every restart picks the same one. The connection
// carries the cluster's pod and service CIDRs (or, if the cluster record has none, the endpoint's
// subnets) and the pair's pre-shared key from the cluster record.
//
// drivers are this node's: a decision for a driver this node does not run is a problem, not a
// connection. A nil drivers does not check (non-gateway nodes route what their gateway connects).
// No subnet that guard refuses is part of a connection (see Guard).
func Desired(st *brokerstate.State, local string, res *policy.Resolver, drivers Drivers, guard Guard) ([]Want, []Problem, []PairDecision) {
	return DesiredAt(st, local, "", res, drivers, guard)
}

// DesiredAt is Desired on gateway node of cluster local. A gateway-mode pair (PairMode) carries
// only the two gateways' mesh addresses: Remote.Subnets is the chosen remote endpoint's mesh
// address (a /32) and Remote.LocalSubnets node's own (its endpoint's mesh_address in st). While
// either end has no mesh address yet the pair is a problem, never a pod-CIDR connection. With
// node "" (a non-gateway node, which only routes what its gateway connects) the own mesh
// address is not needed and LocalSubnets stays empty. The decision's options reach the driver
// without the pair-level "mode" option (policy.DriverOptions).
func DesiredAt(st *brokerstate.State, local, node string, res *policy.Resolver, drivers Drivers, guard Guard) ([]Want, []Problem, []PairDecision) {
	if st == nil {
		return nil, nil, nil
	}
	if res == nil {
		res, _ = Resolver(st)
	}
	byCluster := map[string][]*apiv1.Endpoint{}
	for _, e := range st.Endpoints {
		byCluster[e.GetCluster()] = append(byCluster[e.GetCluster()], e)
	}
	localC := policy.Cluster{Name: local, Labels: st.Clusters[local].GetLabels()}
	var ownMesh netip.Addr
	if node != "" {
		ownMesh = MeshAddress(st.Endpoints[brokerstate.EndpointKey(local, node)])
	}
	protected := append(slices.Clone(guard.Protected), gatewayAddrs(st)...)
	var out []Want
	var problems []Problem
	var decisions []PairDecision
	for _, name := range st.ClusterNames() {
		if name == local {
			continue
		}
		c := st.Clusters[name]
		eps := byCluster[name]
		if len(eps) == 0 {
			continue
		}
		dec := res.Resolve(localC, policy.Cluster{Name: name, Labels: c.GetLabels()})
		mode := PairMode(st.Clusters[local], c, dec.Options)
		decisions = append(decisions, PairDecision{Cluster: name, Connect: dec.Connect, Driver: dec.Driver, Policy: dec.Policy, Default: dec.Default, Mode: mode})
		if !dec.Connect {
			continue
		}
		driver := dec.Driver
		prob := func(msg string) {
			problems = append(problems, Problem{Cluster: name, Driver: driver, Policy: dec.Policy, Message: msg})
		}
		if drivers != nil {
			err, configured := drivers[driver]
			switch {
			case !configured:
				prob(fmt.Sprintf("driver %s is not configured on this node (cableDrivers)", driver))
				continue
			case err != nil:
				prob(fmt.Sprintf("driver %s unavailable on this node: %v", driver, err))
				continue
			}
		}
		sort.Slice(eps, func(i, j int) bool { return eps[i].GetNode() < eps[j].GetNode() })
		var chosen *apiv1.Endpoint
		var addr netip.Addr
		var port uint16
		var skipped []string
		lacking := 0
		for _, e := range eps {
			a, p, why := usable(e, driver)
			if why == whyNotRun {
				lacking++
			}
			if why != "" {
				skipped = append(skipped, e.GetNode()+": "+why)
				continue
			}
			chosen, addr, port = e, a, p
			break
		}
		if chosen == nil {
			if lacking == len(eps) {
				prob("remote gateway does not run driver " + driver)
			} else {
				prob(fmt.Sprintf("no usable %s endpoint (%v)", driver, skipped))
			}
			continue
		}
		cidrs := append(slices.Clone(c.GetPodCidrs()), c.GetServiceCidrs()...)
		if len(cidrs) == 0 {
			cidrs = chosen.GetSubnets()
		}
		var remoteMesh netip.Addr
		var localSubnets []netip.Prefix
		if mode == ModeGateway {
			remoteMesh = MeshAddress(chosen)
			switch {
			case !remoteMesh.IsValid():
				prob(fmt.Sprintf("gateway-mode pair not connected yet: remote gateway %s has no mesh address from the broker yet", chosen.GetNode()))
				continue
			case node != "" && !ownMesh.IsValid():
				prob(fmt.Sprintf("gateway-mode pair not connected yet: this gateway %s has no mesh address from the broker yet", node))
				continue
			}
			// Only the two mesh addresses travel: never a pod or service CIDR of either side.
			cidrs = []string{netip.PrefixFrom(remoteMesh, 32).String()}
			if ownMesh.IsValid() {
				localSubnets = []netip.Prefix{netip.PrefixFrom(ownMesh, 32)}
			}
		}
		parsed, bad := parsePrefixes(cidrs)
		var partial []Problem
		for _, b := range bad {
			partial = append(partial, Problem{Cluster: name, Driver: driver, Policy: dec.Policy, Partial: true, Message: fmt.Sprintf("ignoring subnet %q: not a CIDR", b)})
		}
		var subnets []netip.Prefix
		for _, p := range parsed {
			if why := refusal(p, protected); why != "" {
				partial = append(partial, Problem{Cluster: name, Driver: driver, Policy: dec.Policy, Partial: true, Message: why})
				continue
			}
			subnets = append(subnets, p)
		}
		if len(subnets) == 0 && len(partial) > 0 {
			var why []string
			for _, p := range partial {
				why = append(why, p.Message)
			}
			prob("not connected: no subnet left to route (" + strings.Join(why, "; ") + ")")
			continue
		}
		problems = append(problems, partial...)
		var opts cable.Options
		if o := policy.DriverOptions(dec.Options); len(o) > 0 {
			opts = cable.Options(o)
		}
		out = append(out, Want{
			Remote: cable.RemoteEndpoint{
				Cluster:      name,
				ClusterID:    c.GetId(),
				Node:         chosen.GetNode(),
				Address:      addr,
				Port:         port,
				Attributes:   chosen.Attributes(driver),
				Subnets:      subnets,
				LocalSubnets: localSubnets,
				PreSharedKey: slices.Clone(c.GetPairPsk()),
			},
			Driver:      driver,
			Options:     opts,
			Policy:      dec.Policy,
			GatewayMode: mode == ModeGateway,
			RemoteMesh:  remoteMesh,
		})
	}
	return out, problems, decisions
}

const whyNotRun = "does not run the driver"

// usable says whether e can carry a connection over driver, and where to.
func usable(e *apiv1.Endpoint, driver string) (netip.Addr, uint16, string) {
	if len(e.GetDrivers()) > 0 && !slices.Contains(e.GetDrivers(), driver) {
		return netip.Addr{}, 0, whyNotRun
	}
	ipStr := e.GetPrivateIp()
	if ipStr == "" {
		ipStr = e.GetPublicIp()
	}
	a, err := netip.ParseAddr(ipStr)
	if err != nil {
		return netip.Addr{}, 0, fmt.Sprintf("address %q is not an IP", ipStr)
	}
	p := e.GetCablePorts()[driver]
	if p == 0 || p > 65535 {
		return netip.Addr{}, 0, "publishes no " + driver + " port"
	}
	if err := cable.CheckPublished(driver, e.Attributes(driver)); err != nil {
		return netip.Addr{}, 0, err.Error()
	}
	return a, uint16(p), ""
}

func parsePrefixes(cidrs []string) (good []netip.Prefix, bad []string) {
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			bad = append(bad, s)
			continue
		}
		good = append(good, p.Masked())
	}
	return good, bad
}

// ActionKind is what an action does.
type ActionKind string

const (
	Connect    ActionKind = "connect"
	Disconnect ActionKind = "disconnect"
)

// Action is one change to make through a driver.
type Action struct {
	Kind    ActionKind
	Cluster string
	// Driver is the driver the action goes through.
	Driver string
	// Want is the connection to make (Connect only).
	Want Want
	// MovesTo is, on a Disconnect, the driver the pair moves to ("" when it just goes away);
	// MovesFrom is, on a Connect, the driver the pair was applied on before ("" if none or the
	// same).
	MovesTo, MovesFrom string
	Reason             string
}

// Plan diffs desired connections against what the drivers observed on the host and what this
// process last applied. observed holds an entry (possibly empty) for every driver that could be
// observed; a pair whose wanted or last applied driver is missing from it is left alone this pass.
// repair names pairs to re-assert with Connect although nothing changed (health probes failing),
// with the reason.
//
// Actions come in a stable order: every disconnect first (a pair moving to another driver loses
// its old tunnel and routes before the new one claims them), then connects, each sorted by
// cluster and driver.
//
// A desired connection is (re)connected when its driver does not have it, when the driver has it
// to another endpoint or with other subnets, when the driver reports it in error (Connect is
// idempotent, so this repairs), when it is to be repaired, or when it differs from what this
// process last applied (driver, options, key, PSK: what the device cannot show). applied is empty
// after a restart, so the first pass re-asserts every connection through the driver's idempotent
// Connect: no flap. A connection on any driver that is not desired there is disconnected: a pair
// decided no-connect, gone from the broker, or moved to another driver, and after a restart the
// leftovers of another driver. Nothing else is touched, so with unchanged inputs Plan returns no
// actions.
func Plan(desired []Want, observed map[string][]cable.ConnectionStatus, applied map[string]Want, repair map[string]string) []Action {
	want := map[string]Want{}
	for _, d := range desired {
		want[d.Remote.Cluster] = d
	}
	blocked := func(cluster string) bool {
		if w, ok := want[cluster]; ok {
			if _, seen := observed[w.Driver]; !seen {
				return true
			}
		}
		if a, ok := applied[cluster]; ok {
			if _, seen := observed[a.Driver]; !seen {
				return true
			}
		}
		return false
	}
	var disc, conn []Action
	for driver, conns := range observed {
		for _, o := range conns {
			w, wanted := want[o.Cluster]
			if wanted && w.Driver == driver {
				continue
			}
			if blocked(o.Cluster) {
				continue
			}
			a := Action{Kind: Disconnect, Cluster: o.Cluster, Driver: driver, Reason: "pair is not wanted (no-connect, or no usable endpoint)"}
			if wanted {
				a.MovesTo = w.Driver
				a.Reason = fmt.Sprintf("pair moves from %s to %s (policy %s)", driver, w.Driver, w.Policy)
			}
			disc = append(disc, a)
		}
	}
	for name, d := range want {
		if blocked(name) {
			continue
		}
		var o cable.ConnectionStatus
		onDevice := false
		for _, c := range observed[d.Driver] {
			if c.Cluster == name {
				o, onDevice = c, true
				break
			}
		}
		prev, wasApplied := applied[name]
		var reason string
		switch {
		case !onDevice:
			reason = "not on the " + d.Driver + " device"
		case o.Endpoint != "" && o.Endpoint != EndpointString(d.Remote):
			reason = fmt.Sprintf("device has endpoint %s, want %s", o.Endpoint, EndpointString(d.Remote))
		case o.Subnets != nil && !samePrefixes(o.Subnets, d.Remote.Subnets):
			reason = fmt.Sprintf("device has subnets %v, want %v", o.Subnets, d.Remote.Subnets)
		case o.State == cable.StateError:
			reason = "device reports error: " + o.Message
		case repair[name] != "":
			reason = repair[name]
		case !wasApplied:
			reason = "not applied by this process yet"
		case !EqualWant(prev, d):
			reason = "policy decision or endpoint record changed"
		default:
			continue
		}
		a := Action{Kind: Connect, Cluster: name, Driver: d.Driver, Want: d, Reason: reason}
		if wasApplied && prev.Driver != d.Driver {
			a.MovesFrom = prev.Driver
		}
		conn = append(conn, a)
	}
	order := func(a, b Action) int {
		return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Driver, b.Driver))
	}
	slices.SortFunc(disc, order)
	slices.SortFunc(conn, order)
	return append(disc, conn...)
}

// EndpointString is the remote address:port as drivers report it in ConnectionStatus.Endpoint.
func EndpointString(r cable.RemoteEndpoint) string {
	if !r.Address.IsValid() {
		return ""
	}
	return netip.AddrPortFrom(r.Address, r.Port).String()
}

// Equal compares two remote endpoints field by field, subnets as sets.
func Equal(a, b cable.RemoteEndpoint) bool {
	return a.Cluster == b.Cluster && a.ClusterID == b.ClusterID && a.Node == b.Node && a.Address == b.Address &&
		a.Port == b.Port && maps.Equal(a.Attributes, b.Attributes) && samePrefixes(a.Subnets, b.Subnets) &&
		samePrefixes(a.LocalSubnets, b.LocalSubnets) && string(a.PreSharedKey) == string(b.PreSharedKey)
}

// EqualWant compares two wanted connections: endpoint, driver, options and mode.
func EqualWant(a, b Want) bool {
	return a.Driver == b.Driver && maps.Equal(a.Options, b.Options) && Equal(a.Remote, b.Remote) &&
		a.GatewayMode == b.GatewayMode && a.RemoteMesh == b.RemoteMesh
}

func samePrefixes(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	x := slices.Clone(a)
	y := slices.Clone(b)
	cmpP := func(p, q netip.Prefix) int {
		if c := p.Addr().Compare(q.Addr()); c != 0 {
			return c
		}
		return p.Bits() - q.Bits()
	}
	slices.SortFunc(x, cmpP)
	slices.SortFunc(y, cmpP)
	return slices.Equal(x, y)
}
