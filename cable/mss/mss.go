// Package mss clamps the TCP MSS of connections that leave through the mesh's tunnels to the
// path MTU of their route, so TCP works through cables whose MTU is below the underlay's even when
// ICMP "fragmentation needed" is filtered somewhere (PMTU black holes).
//
// It owns one nftables table, inet "cablemesh", with a forward and an output chain (type filter,
// priority mangle) holding one rule per tunnel interface prefix, the equivalent of
//
//	oifname "cbl-*" tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
//
// The kernel only ever lowers the MSS option with this expression (nft_exthdr's TCP option write
// keeps a smaller value), so a SYN that already carries a small MSS keeps it. The package talks
// netlink directly (github.com/google/nftables): no nft binary is needed.
package mss

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table this package owns (family inet).
const TableName = "cablemesh"

// Chain names.
const (
	ChainForward = "forward"
	ChainOutput  = "output"
)

// userDataPrefix tags each rule with the interface prefix it clamps, so a read-back can tell our
// rules apart and compare them with the wanted ones (the library cannot decode every expression
// of a rule it reads back).
const userDataPrefix = "cablemesh mss oifname="

// maxIfacePrefix is IFNAMSIZ-1: the longest interface name.
const maxIfacePrefix = unix.IFNAMSIZ - 1

// TCP header facts the rule uses.
const (
	tcpFlagsOffset = 13   // byte offset of the flags in the TCP header
	tcpSYN         = 0x02 // SYN flag
	tcpRST         = 0x04 // RST flag
	tcpOptMaxseg   = 2    // TCP option kind MSS
	mssValueOffset = 2    // the 2-byte MSS value follows kind and length
	mssValueLen    = 2
)

// ValidatePrefixes checks interface prefixes: non-empty, at most 15 bytes, no NUL, '/' or
// whitespace, no duplicates.
func ValidatePrefixes(prefixes []string) error {
	if len(prefixes) == 0 {
		return errors.New("mss: no interface prefix given")
	}
	for i, p := range prefixes {
		switch {
		case p == "":
			return fmt.Errorf("mss: interface prefix [%d] is empty (it would match every interface)", i)
		case len(p) > maxIfacePrefix:
			return fmt.Errorf("mss: interface prefix [%d] %q is longer than %d bytes", i, p, maxIfacePrefix)
		case strings.ContainsAny(p, "\x00/ \t\n"):
			return fmt.Errorf("mss: interface prefix [%d] %q holds a character no interface name has", i, p)
		case slices.Index(prefixes, p) != i:
			return fmt.Errorf("mss: interface prefix [%d] %q is listed twice", i, p)
		}
	}
	return nil
}

// RuleExprs is the rule that clamps SYNs leaving through an interface whose name starts with
// prefix. It is pure.
func RuleExprs(prefix string) []expr.Any {
	return []expr.Any{
		// oifname "<prefix>*": compare only the prefix's bytes (no terminating NUL).
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
		// meta l4proto tcp
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		// tcp flags & (syn|rst) == syn: SYN and SYN-ACK, not resets.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: tcpFlagsOffset, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpSYN | tcpRST}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tcpSYN}},
		// tcp option maxseg size set rt mtu: the route's MSS (its MTU minus headers), in network
		// byte order, written over the option's value.
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{SourceRegister: 1, Type: tcpOptMaxseg, Offset: mssValueOffset, Len: mssValueLen, Op: expr.ExthdrOpTcpopt},
	}
}

// Spec is the wanted content of the table: per chain, the prefixes of its rules, in order.
type Spec struct {
	Chains map[string][]string
}

// Want is the Spec for prefixes: both chains hold one rule per prefix.
func Want(prefixes []string) Spec {
	return Spec{Chains: map[string][]string{ChainForward: slices.Clone(prefixes), ChainOutput: slices.Clone(prefixes)}}
}

func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

func chain(t *nftables.Table, name string) *nftables.Chain {
	hook := nftables.ChainHookForward
	if name == ChainOutput {
		hook = nftables.ChainHookOutput
	}
	return &nftables.Chain{
		Name:     name,
		Table:    t,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  hook,
		Priority: nftables.ChainPriorityMangle,
	}
}

// Ensure makes the table hold exactly the clamping rules for ifacePrefixes. It changes nothing
// when the table already does (read back and compared); otherwise it replaces the table in one
// netlink transaction, so there is no moment without clamping and no half-built table.
func Ensure(ifacePrefixes []string) error {
	if err := ValidatePrefixes(ifacePrefixes); err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("mss: open netlink: %w", err)
	}
	want := Want(ifacePrefixes)
	if got, err := read(c); err == nil && got.Equal(want) {
		return nil
	}
	t := table()
	// Add (no-op if present) then delete, then build: one atomic batch whatever was there.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	for _, name := range []string{ChainForward, ChainOutput} {
		ch := c.AddChain(chain(t, name))
		for _, p := range want.Chains[name] {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: RuleExprs(p), UserData: []byte(userDataPrefix + p)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("mss: install table inet %s: %w", TableName, err)
	}
	got, err := read(c)
	if err != nil {
		return fmt.Errorf("mss: read back table inet %s: %w", TableName, err)
	}
	if !got.Equal(want) {
		return fmt.Errorf("mss: table inet %s reads back as %v, want %v", TableName, got.Chains, want.Chains)
	}
	return nil
}

// Remove deletes the table; a missing table is no error.
func Remove() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("mss: open netlink: %w", err)
	}
	// Add (no-op if present) then delete in one batch: no error when it was never there.
	c.AddTable(table())
	c.DelTable(table())
	if err := c.Flush(); err != nil {
		return fmt.Errorf("mss: delete table inet %s: %w", TableName, err)
	}
	return nil
}

// Installed reads the table back: per chain, the prefixes of the rules this package wrote (a rule
// it did not write shows as "?"). ok is false when the table does not exist.
func Installed() (spec Spec, ok bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return Spec{}, false, fmt.Errorf("mss: open netlink: %w", err)
	}
	spec, err = read(c)
	if errors.Is(err, errNoTable) {
		return Spec{}, false, nil
	}
	return spec, err == nil, err
}

var errNoTable = errors.New("no table")

func read(c *nftables.Conn) (Spec, error) {
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		return Spec{}, errNoTable
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return Spec{}, err
	}
	spec := Spec{Chains: map[string][]string{}}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		want := chain(table(), ch.Name)
		if ch.Type != want.Type || ch.Hooknum == nil || *ch.Hooknum != *want.Hooknum || ch.Priority == nil || *ch.Priority != *want.Priority {
			spec.Chains[ch.Name+"(wrong hook)"] = nil
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return Spec{}, err
		}
		prefixes := []string{}
		for _, r := range rules {
			p, ok := strings.CutPrefix(string(r.UserData), userDataPrefix)
			if !ok || !writesMSS(r.Exprs) {
				p = "?"
			}
			prefixes = append(prefixes, p)
		}
		spec.Chains[ch.Name] = prefixes
	}
	return spec, nil
}

// writesMSS reports whether exprs (as read back) match an oifname prefix and write the MSS option.
func writesMSS(exprs []expr.Any) bool {
	var oif, write bool
	for _, e := range exprs {
		switch x := e.(type) {
		case *expr.Meta:
			oif = oif || x.Key == expr.MetaKeyOIFNAME
		case *expr.Exthdr:
			write = write || (x.Op == expr.ExthdrOpTcpopt && x.Type == tcpOptMaxseg && x.SourceRegister != 0)
		}
	}
	return oif && write
}

// Equal compares two specs.
func (s Spec) Equal(o Spec) bool {
	if len(s.Chains) != len(o.Chains) {
		return false
	}
	for k, v := range s.Chains {
		w, ok := o.Chains[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}
