// Package mss clamps the TCP MSS of connections that leave through the mesh's tunnels to the
// path MTU of their route, so TCP works through cables whose MTU is below the underlay's even when
// ICMP "fragmentation needed" is filtered somewhere (PMTU black holes).
//
// It owns one nftables table, inet "cablemesh", with a forward and an output chain (type filter,
// priority mangle) holding one rule per tunnel link, the equivalent of
//
//	oifname "cbl-*" tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu
//
// Links are given as the cable drivers' Links() name them: an exact name ("wg-east") or a prefix
// ending in '*' ("cbl-vx*"), matched as nft matches oifname "wg-east" and oifname "cbl-vx*".
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

	"github.com/cablemesh/cablemesh/cable"
)

// TableName is the nftables table this package owns (family inet).
const TableName = "cablemesh"

// Chain names.
const (
	ChainForward = "forward"
	ChainOutput  = "output"
)

// userDataPrefix tags each rule with the link it clamps, so a read-back can tell our rules apart
// and compare them with the wanted ones (the library cannot decode every expression of a rule it
// reads back).
const userDataPrefix = "cablemesh mss oifname="

// wildcard ends a link that is a prefix of names rather than a name.
const wildcard = "*"

// TCP header facts the rule uses.
const (
	tcpFlagsOffset = 13   // byte offset of the flags in the TCP header
	tcpSYN         = 0x02 // SYN flag
	tcpRST         = 0x04 // RST flag
	tcpOptMaxseg   = 2    // TCP option kind MSS
	mssValueOffset = 2    // the 2-byte MSS value follows kind and length
	mssValueLen    = 2
)

// ValidateLinks checks links: each an interface name, or a prefix of one followed by '*'; the
// name or prefix non-empty, at most 15 bytes, without NUL, '/', ':' or whitespace; no duplicates.
func ValidateLinks(links []string) error {
	if len(links) == 0 {
		return errors.New("mss: no link given")
	}
	for i, l := range links {
		name := strings.TrimSuffix(l, wildcard)
		switch {
		case name == "":
			return fmt.Errorf("mss: link [%d] %q is empty (it would match every interface)", i, l)
		case strings.Contains(name, wildcard):
			return fmt.Errorf("mss: link [%d] %q has a '*' before its end", i, l)
		case slices.Index(links, l) != i:
			return fmt.Errorf("mss: link [%d] %q is listed twice", i, l)
		}
		if err := cable.CheckLinkName(name, cable.MaxLinkName); err != nil {
			return fmt.Errorf("mss: link [%d] %q: name %w", i, l, err)
		}
	}
	return nil
}

// oifname is what the rule compares the outgoing interface's name with: for a prefix its bytes
// alone, for an exact name the whole IFNAMSIZ buffer, NUL-padded as the kernel loads it (nft's own
// form of oifname "wg-east").
func oifname(link string) []byte {
	if prefix, ok := strings.CutSuffix(link, wildcard); ok {
		return []byte(prefix)
	}
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, link)
	return b
}

// RuleExprs is the rule that clamps SYNs leaving through link (a name, or a prefix ending in
// '*'). It is pure.
func RuleExprs(link string) []expr.Any {
	return []expr.Any{
		// oifname "<link>"
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: oifname(link)},
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

// Spec is the wanted content of the table: per chain, the links of its rules, in order.
type Spec struct {
	Chains map[string][]string
}

// Want is the Spec for links: both chains hold one rule per link.
func Want(links []string) Spec {
	return Spec{Chains: map[string][]string{ChainForward: slices.Clone(links), ChainOutput: slices.Clone(links)}}
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

// Ensure makes the table hold exactly the clamping rules for links, in the drivers' Links() form
// (see ValidateLinks); with no link at all there is nothing to clamp: call Remove. It changes
// nothing when the table already holds them (read back and compared); otherwise it replaces the
// table in one netlink transaction, so there is no moment without clamping and no half-built
// table.
func Ensure(links []string) error {
	if err := ValidateLinks(links); err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("mss: open netlink: %w", err)
	}
	want := Want(links)
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

// Installed reads the table back: per chain, the links of the rules this package wrote (a rule it
// did not write shows as "?"). ok is false when the table does not exist.
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
		links := []string{}
		for _, r := range rules {
			l, ok := strings.CutPrefix(string(r.UserData), userDataPrefix)
			if !ok || !writesMSS(r.Exprs) {
				l = "?"
			}
			links = append(links, l)
		}
		spec.Chains[ch.Name] = links
	}
	return spec, nil
}

// writesMSS reports whether exprs (as read back) match an oifname and write the MSS option.
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
