// Package nftables is the kernel ingress data plane of a gateway: one
// nftables table, family ip, named cablemesh-ingress, replaced atomically (one netlink batch) on
// every Apply. It holds
//
//	chain prerouting  (nat, dstnat):  ip daddr MESH jump services
//	chain output      (nat, dstnat):  ip daddr MESH jump services   (the gateway's own processes)
//	chain services:                   meta l4proto tcp th dport P dnat to B             (one backend)
//	                                  meta l4proto tcp th dport P numgen random mod N vmap @lb-tcp-P
//	map lb-tcp-P:                     { i : goto be-tcp-P-i }   (several backends)
//	chain be-tcp-P-i:                 dnat to B_i
//	chain input       (filter):       ip daddr MESH meta l4proto tcp th dport P reject with tcp reset
//	                                  (ports without backends fail fast; UDP: icmp port-unreachable)
//	chain postrouting (nat, srcnat):  ip daddr @remote_mesh snat to MESH
//	set remote_mesh:                  the remote gateways' mesh addresses
//
// Conntrack undoes both translations on replies. DNATed traffic is not masqueraded: the backend
// sees the calling gateway's mesh address (which its route to the remote mesh leads back through
// this gateway). IPv4 only for now.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/agent/ingress"
)

// Dataplane is the kernel ingress (ingress.Dataplane) in the network namespace the process was
// in when New ran.
type Dataplane struct {
	log *slog.Logger

	mu      sync.Mutex
	conn    *nftables.Conn
	applied *Plan // last plan the kernel accepted; nil before the first Apply
	status  ingress.Status
}

var _ ingress.Dataplane = (*Dataplane)(nil)

// errNoDataplane: a nil *Dataplane (New failed, and the nil pointer went into an
// ingress.Dataplane interface) reports an error instead of panicking.
var errNoDataplane = errors.New("ingress data plane not opened")

// New opens a netlink connection in the calling thread's network namespace (the agent runs inside
// its node's namespace) and keeps it, so later calls from any thread act on that namespace.
func New(log *slog.Logger) (*Dataplane, error) {
	if log == nil {
		log = slog.Default()
	}
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink connection: %w", err)
	}
	return &Dataplane{log: log.With("component", "ingress-nftables"), conn: conn}, nil
}

func (d *Dataplane) table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
}

// Apply validates cfg (a bad one changes nothing) and replaces the table with its plan in one
// batch: add (so the delete cannot fail on a missing table), delete, recreate. Established flows
// survive a replace: their translation lives in conntrack, not in the rules.
func (d *Dataplane) Apply(ctx context.Context, cfg ingress.Config) error {
	if d == nil {
		return errNoDataplane
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	plan, err := NewPlan(cfg)
	if err != nil {
		d.mu.Lock()
		d.status.LastError = err.Error()
		d.mu.Unlock()
		return fmt.Errorf("ingress config: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		return errors.New("ingress data plane is closed")
	}
	rules := d.build(plan)
	if err := d.conn.Flush(); err != nil {
		err = fmt.Errorf("replace nftables table ip %s: %w", TableName, err)
		d.status.LastError = err.Error()
		return err
	}
	d.applied = &plan
	ports, without, backends := plan.Counts()
	d.status = ingress.Status{
		Programmed:           true,
		RemoteMeshAddresses:  len(plan.Remote),
		Ports:                ports,
		PortsWithoutBackends: without,
		Backends:             backends,
		Rules:                rules,
		LastApply:            time.Now(),
	}
	if plan.Mesh.IsValid() {
		d.status.MeshAddress = plan.Mesh.String()
	}
	d.log.Debug("ingress table applied", "mesh", d.status.MeshAddress, "ports", ports, "backends", backends, "rules", rules)
	return nil
}

// build queues the batch replacing the table with plan's Ruleset and returns the number of
// rules. It translates each Rule one to one and decides nothing itself.
func (d *Dataplane) build(plan Plan) int {
	rs := plan.Ruleset()
	c := d.conn
	t := d.table()
	c.AddTable(t)
	c.DelTable(t)
	if !rs.Present {
		return 0 // no mesh address: no table
	}
	c.AddTable(t)

	remote := &nftables.Set{Table: t, Name: SetRemoteMesh, KeyType: nftables.TypeIPAddr}
	var elems []nftables.SetElement
	for _, a := range rs.RemoteMesh {
		elems = append(elems, nftables.SetElement{Key: a.AsSlice()})
	}
	// AddSet only fails on an anonymous set that is not constant: none here.
	_ = c.AddSet(remote, elems)

	chains := map[string]*nftables.Chain{}
	for _, ch := range rs.Chains {
		nc := &nftables.Chain{Table: t, Name: ch.Name}
		switch ch.Hook {
		case HookPrerouting:
			nc.Type, nc.Hooknum, nc.Priority = nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest
		case HookOutput:
			nc.Type, nc.Hooknum, nc.Priority = nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest
		case HookInput:
			nc.Type, nc.Hooknum, nc.Priority = nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter
		case HookPostrouting:
			nc.Type, nc.Hooknum, nc.Priority = nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource
		}
		chains[ch.Name] = c.AddChain(nc)
	}
	// Maps after the chains their verdicts go to, rules after the maps they look up.
	maps := map[string]*nftables.Set{remote.Name: remote}
	for _, m := range rs.Maps {
		// A named map rather than an anonymous one: the library marks anonymous sets' keys
		// big-endian, so nft would print the host-order numgen keys 0, 1 as 0, 16777216.
		vmap := &nftables.Set{Table: t, Name: m.Name, IsMap: true,
			KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}
		var elems []nftables.SetElement
		for i, target := range m.Chains {
			elems = append(elems, nftables.SetElement{
				Key:         binaryutil.NativeEndian.PutUint32(uint32(i)), // numgen writes host order
				VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: target},
			})
		}
		_ = c.AddSet(vmap, elems)
		maps[m.Name] = vmap
	}
	for _, ch := range rs.Chains {
		for _, r := range ch.Rules {
			nr := &nftables.Rule{Table: t, Chain: chains[ch.Name], Exprs: ruleExprs(r, maps)}
			if r.Comment != "" {
				nr.UserData = userdata.AppendString(nil, userdata.TypeComment, r.Comment)
			}
			c.AddRule(nr)
		}
	}
	return rs.RuleCount()
}

// ruleExprs translates one Rule.
func ruleExprs(r Rule, sets map[string]*nftables.Set) []expr.Any {
	var ex []expr.Any
	if r.Daddr.IsValid() {
		ex = append(ex, matchDaddr(r.Daddr.AsSlice())...)
	}
	if r.DaddrInRemote {
		s := sets[SetRemoteMesh]
		ex = append(ex,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
	}
	if r.Proto != 0 {
		ex = append(ex,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.Proto}})
	}
	if r.DPort != 0 {
		ex = append(ex,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.DPort)})
	}
	switch {
	case r.Jump != "":
		ex = append(ex, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Jump})
	case r.DNAT.IsValid():
		ex = append(ex, dnat(r.DNAT)...)
	case r.Numgen != 0:
		m := sets[r.Map]
		ex = append(ex,
			&expr.Numgen{Register: 1, Modulus: r.Numgen, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID})
	case r.Reject && r.Proto == protoUDP:
		ex = append(ex, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}) // port unreachable
	case r.Reject:
		ex = append(ex, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	case r.SNAT.IsValid():
		ex = append(ex,
			&expr.Immediate{Register: 1, Data: r.SNAT.AsSlice()},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1})
	}
	return ex
}

// matchDaddr: ip daddr == a.
func matchDaddr(a []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a},
	}
}

// dnat: dnat to b (address in reg 1, port in reg 2).
func dnat(b netip.AddrPort) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: b.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(b.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// Status reports what the last Apply programmed, checked against the kernel: a table removed
// behind the agent's back (nft flush ruleset, another tool) shows as not programmed until the
// next Apply recreates it.
func (d *Dataplane) Status() ingress.Status {
	if d == nil {
		return ingress.Status{LastError: errNoDataplane.Error()}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.status
	if st.Programmed && d.applied != nil && d.applied.Mesh.IsValid() && d.conn != nil {
		present, err := d.tablePresent()
		switch {
		case err != nil:
			st.LastError = fmt.Sprintf("read back table ip %s: %v", TableName, err)
		case !present:
			st.Programmed = false
			st.LastError = fmt.Sprintf("table ip %s is missing from the kernel (removed outside the agent); the next apply recreates it", TableName)
		}
	}
	return st
}

func (d *Dataplane) tablePresent() (bool, error) {
	tabs, err := d.conn.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, err
	}
	for _, t := range tabs {
		if t.Name == TableName {
			return true, nil
		}
	}
	return false, nil
}

// Cleanup deletes the table and the cbl-mesh0 link. Idempotent.
func (d *Dataplane) Cleanup(ctx context.Context) error {
	if d == nil {
		return errNoDataplane
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		return errors.New("ingress data plane is closed")
	}
	t := d.table()
	d.conn.AddTable(t)
	d.conn.DelTable(t)
	var errs []error
	if err := d.conn.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("delete nftables table ip %s: %w", TableName, err))
	}
	if err := ingress.RemoveMeshLink(); err != nil {
		errs = append(errs, err)
	}
	d.applied = nil
	d.status = ingress.Status{}
	return errors.Join(errs...)
}

// Close releases the netlink connection; the table stays.
func (d *Dataplane) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		return nil
	}
	err := d.conn.CloseLasting()
	d.conn = nil
	return err
}

// Applied returns the last plan the kernel accepted (for tests and diagnostics).
func (d *Dataplane) Applied() (Plan, bool) {
	if d == nil {
		return Plan{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.applied == nil {
		return Plan{}, false
	}
	return *d.applied, true
}
