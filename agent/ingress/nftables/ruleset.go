package nftables

import (
	"fmt"
	"net/netip"
	"strings"
)

// The rule plan: Plan → Ruleset, still pure. The netlink half (build) translates each Rule into
// expressions one to one and decides nothing, so the table's whole layout is tested here.

// Hook names a base chain's hook; "" is a regular chain (reached by jump or goto).
type Hook string

const (
	HookNone        Hook = ""
	HookPrerouting  Hook = "prerouting"  // nat, priority dstnat
	HookOutput      Hook = "output"      // nat, priority dstnat
	HookInput       Hook = "input"       // filter, priority filter
	HookPostrouting Hook = "postrouting" // nat, priority srcnat
)

// Ruleset is the whole table.
type Ruleset struct {
	// Present: false = no table at all (no mesh address).
	Present bool
	// RemoteMesh is the content of set remote_mesh.
	RemoteMesh []netip.Addr
	Chains     []Chain
	Maps       []VerdictMap
}

// Chain is one chain and its rules in order.
type Chain struct {
	Name  string
	Hook  Hook
	Rules []Rule
}

// VerdictMap maps numgen's pick i to "goto Chains[i]".
type VerdictMap struct {
	Name   string
	Chains []string
}

// Rule is one rule: its matches (all optional) and exactly one action.
type Rule struct {
	Comment string

	Daddr         netip.Addr // ip daddr == Daddr, when valid
	DaddrInRemote bool       // ip daddr @remote_mesh
	Proto         uint8      // meta l4proto == Proto, when nonzero
	DPort         uint16     // th dport == DPort, when nonzero (needs Proto)

	Jump   string         // jump to a chain
	DNAT   netip.AddrPort // dnat to
	Numgen uint32         // numgen random mod Numgen vmap @Map
	Map    string         //
	Reject bool           // TCP: reset; UDP: icmp port unreachable
	SNAT   netip.Addr     // snat to
}

// String renders the rule in nft's syntax (for tests and humans).
func (r Rule) String() string {
	var f []string
	if r.Daddr.IsValid() {
		f = append(f, "ip daddr "+r.Daddr.String())
	}
	if r.DaddrInRemote {
		f = append(f, "ip daddr @"+SetRemoteMesh)
	}
	proto := "tcp"
	if r.Proto == protoUDP {
		proto = "udp"
	}
	if r.Proto != 0 && r.DPort == 0 {
		f = append(f, "meta l4proto "+proto)
	}
	if r.DPort != 0 {
		f = append(f, fmt.Sprintf("%s dport %d", proto, r.DPort))
	}
	switch {
	case r.Jump != "":
		f = append(f, "jump "+r.Jump)
	case r.DNAT.IsValid():
		f = append(f, "dnat to "+r.DNAT.String())
	case r.Numgen != 0:
		f = append(f, fmt.Sprintf("numgen random mod %d vmap @%s", r.Numgen, r.Map))
	case r.Reject && r.Proto == protoUDP:
		f = append(f, "reject with icmp port-unreachable")
	case r.Reject:
		f = append(f, "reject with tcp reset")
	case r.SNAT.IsValid():
		f = append(f, "snat to "+r.SNAT.String())
	}
	return strings.Join(f, " ")
}

// Ruleset lays out the table for p:
//
//	prerouting, output:  ip daddr MESH jump services
//	services:            per port with backends: dnat (one) or numgen vmap (several)
//	be-P-N-i:            dnat to backend i
//	input:               per port without backends: reject
//	postrouting:         ip daddr @remote_mesh snat to MESH
func (p Plan) Ruleset() Ruleset {
	if !p.Mesh.IsValid() {
		return Ruleset{}
	}
	rs := Ruleset{Present: true, RemoteMesh: p.Remote}
	toServices := Rule{Comment: "to this gateway's mesh address", Daddr: p.Mesh, Jump: ChainServices}
	services := Chain{Name: ChainServices}
	input := Chain{Name: ChainInput, Hook: HookInput}
	var backendChains []Chain
	for _, pp := range p.Ports {
		switch len(pp.Backends) {
		case 0:
			input.Rules = append(input.Rules, Rule{Comment: pp.Label + ": no ready backend",
				Daddr: p.Mesh, Proto: pp.Proto, DPort: pp.Port, Reject: true})
		case 1:
			services.Rules = append(services.Rules, Rule{Comment: pp.Label, Proto: pp.Proto, DPort: pp.Port, DNAT: pp.Backends[0]})
		default:
			m := VerdictMap{Name: pp.MapName()}
			for i, b := range pp.Backends {
				name := pp.BackendChain(i)
				m.Chains = append(m.Chains, name)
				backendChains = append(backendChains, Chain{Name: name, Rules: []Rule{{Comment: pp.Label + " → " + b.String(), DNAT: b}}})
			}
			rs.Maps = append(rs.Maps, m)
			services.Rules = append(services.Rules, Rule{Comment: pp.Label, Proto: pp.Proto, DPort: pp.Port,
				Numgen: uint32(len(pp.Backends)), Map: m.Name})
		}
	}
	rs.Chains = append(rs.Chains,
		services,
		Chain{Name: ChainPrerouting, Hook: HookPrerouting, Rules: []Rule{toServices}},
		Chain{Name: ChainOutput, Hook: HookOutput, Rules: []Rule{toServices}},
		input,
		Chain{Name: ChainPostrouting, Hook: HookPostrouting, Rules: []Rule{{
			Comment:       "to a remote gateway: the calling gateway's mesh address is the source",
			DaddrInRemote: true, SNAT: p.Mesh}}},
	)
	rs.Chains = append(rs.Chains, backendChains...)
	return rs
}

// RuleCount counts the rules of all chains.
func (rs Ruleset) RuleCount() int {
	n := 0
	for _, c := range rs.Chains {
		n += len(c.Rules)
	}
	return n
}

// Lines renders the ruleset as "chain: rule" lines, for tests.
func (rs Ruleset) Lines() []string {
	var out []string
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			out = append(out, c.Name+": "+r.String())
		}
	}
	for _, m := range rs.Maps {
		var e []string
		for i, c := range m.Chains {
			e = append(e, fmt.Sprintf("%d: goto %s", i, c))
		}
		out = append(out, "map "+m.Name+": "+strings.Join(e, ", "))
	}
	return out
}
