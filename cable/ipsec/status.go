package ipsec

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// connInfo is what the driver knows about a connection it loaded, to name and judge what
// list-sas reports.
type connInfo struct {
	Cluster   string
	Node      string
	Endpoint  string // configured remote address and IKE port, as reported in ConnectionStatus
	Subnets   []netip.Prefix
	Initiator bool
	LoadedAt  time.Time
}

// Grace periods before a connection that has not come up is reported as an error rather than as
// connecting: long enough for a peer that starts a little later and for one retransmission
// sequence, short enough for an operator to see a wrong key or an unreachable peer.
const (
	noSAGrace    = 60 * time.Second
	noChildGrace = 15 * time.Second
)

// ikeSA is the part of one list-sas entry we use.
type ikeSA struct {
	State       string
	RemoteHost  string
	RemotePort  string
	Established time.Duration // -1 when not established
	Children    []childSA
}

type childSA struct {
	State    string
	BytesIn  uint64
	BytesOut uint64
}

// parseSAs turns list-sas events (each {ike-name: {...}}) into SAs by connection name. Values
// it cannot parse count as absent: the state is then judged on what is there.
func parseSAs(events []map[string]any) map[string][]ikeSA {
	out := map[string][]ikeSA{}
	for _, ev := range events {
		for name, v := range ev {
			sec, ok := v.(map[string]any)
			if !ok {
				continue
			}
			sa := ikeSA{
				State:       str(sec["state"]),
				RemoteHost:  str(sec["remote-host"]),
				RemotePort:  str(sec["remote-port"]),
				Established: -1,
			}
			if s, err := strconv.ParseUint(str(sec["established"]), 10, 32); err == nil {
				sa.Established = time.Duration(s) * time.Second
			}
			children, _ := sec["child-sas"].(map[string]any)
			keys := make([]string, 0, len(children))
			for k := range children {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				c, ok := children[k].(map[string]any)
				if !ok {
					continue
				}
				in, _ := strconv.ParseUint(str(c["bytes-in"]), 10, 64)
				outb, _ := strconv.ParseUint(str(c["bytes-out"]), 10, 64)
				sa.Children = append(sa.Children, childSA{State: str(c["state"]), BytesIn: in, BytesOut: outb})
			}
			out[name] = append(out[name], sa)
		}
	}
	return out
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// ikeUsable are the IKE_SA states in which its CHILD_SAs carry traffic.
var ikeUsable = []string{"ESTABLISHED", "REKEYING", "REKEYED"}

// connectionStatuses computes one status per connection from what charon reports: loaded are
// the connections this driver loaded, with what it knows about them; foreign are names of ours
// (ConnPrefix) that charon holds but this driver did not load (left by an earlier agent run, in a
// system charon or in our own, which Init adopted, until the agent Connects or Disconnects
// them); sas is what list-sas says. Anything of ours the driver does not know is reported with an
// error, so the agent can Disconnect it. Pure, so it is table-tested; mtu is the tunnel MTU.
func connectionStatuses(loaded map[string]connInfo, foreign []string, sas map[string][]ikeSA, now time.Time, mtu int) []cable.ConnectionStatus {
	names := map[string]bool{}
	for n := range loaded {
		names[n] = true
	}
	for _, n := range foreign {
		if clusterFromConn(n) != "" {
			names[n] = true
		}
	}
	for n := range sas {
		if clusterFromConn(n) != "" {
			names[n] = true
		}
	}
	out := make([]cable.ConnectionStatus, 0, len(names))
	for name := range names {
		info, known := loaded[name]
		st := cable.ConnectionStatus{
			Cluster:  clusterFromConn(name),
			Node:     info.Node,
			Endpoint: info.Endpoint,
			MTU:      mtu,
			Subnets:  slices.Clone(info.Subnets),
		}
		st.State, st.Message = judge(info, known, sas[name], now)
		if sa, ok := best(sas[name]); ok {
			// Endpoint stays the configured one (the agent compares it with the endpoint it
			// wants, as it does for every driver): the IKE_SA's live port is the peer's NAT-T port
			// (4500) as soon as UDP encapsulation is on, always with encap=yes. Only a live address
			// other than the configured one (a NAT rewriting the peer's) is worth a word.
			if note := liveEndpointNote(info.Endpoint, sa); note != "" {
				if st.Message != "" {
					st.Message += "; "
				}
				st.Message += note
			}
			for _, c := range sa.Children {
				if c.State == "INSTALLED" || c.State == "REKEYING" || c.State == "REKEYED" || c.State == "DELETING" {
					// Bytes of every CHILD_SA of the IKE_SA: during a rekey two carry traffic.
					st.RxBytes += c.BytesIn
					st.TxBytes += c.BytesOut
				}
			}
			if sa.Established >= 0 {
				st.LastHandshake = now.Add(-sa.Established).Truncate(time.Second)
			}
		}
		out = append(out, st)
	}
	cable.SortConnections(out)
	return out
}

func parsePort(s string) uint16 {
	p, _ := strconv.ParseUint(s, 10, 16)
	return uint16(p)
}

// liveEndpointNote says where the IKE_SA's peer really is when that is another address than the
// configured endpoint's ("" when it is the same address, whatever the port, or unknown).
func liveEndpointNote(configured string, sa ikeSA) string {
	want, err := netip.ParseAddrPort(configured)
	if err != nil {
		return ""
	}
	a, err := netip.ParseAddr(sa.RemoteHost)
	if err != nil || a.Unmap() == want.Addr().Unmap() {
		return ""
	}
	return fmt.Sprintf("IKE_SA peer is %s, not the configured %s (a NAT between?)", netip.AddrPortFrom(a, parsePort(sa.RemotePort)), configured)
}

// best picks the IKE_SA that says most about the connection: a usable one with an installed
// CHILD_SA first, then any usable one, then the first.
func best(sas []ikeSA) (ikeSA, bool) {
	if len(sas) == 0 {
		return ikeSA{}, false
	}
	for _, sa := range sas {
		if slices.Contains(ikeUsable, sa.State) && hasInstalled(sa) {
			return sa, true
		}
	}
	for _, sa := range sas {
		if slices.Contains(ikeUsable, sa.State) {
			return sa, true
		}
	}
	return sas[0], true
}

func hasInstalled(sa ikeSA) bool {
	for _, c := range sa.Children {
		if c.State == "INSTALLED" || c.State == "REKEYING" || c.State == "REKEYED" {
			return true
		}
	}
	return false
}

// judge says connected only when an IKE_SA is established and one of its CHILD_SAs is installed:
// that is when packets flow. Before that the connection is connecting, until a grace period
// makes it an error with a message saying what is missing.
func judge(info connInfo, known bool, sas []ikeSA, now time.Time) (cable.State, string) {
	if !known {
		return cable.StateError, "connection is loaded in charon but belongs to no cluster this driver connected"
	}
	sa, ok := best(sas)
	since := now.Sub(info.LoadedAt)
	if !ok {
		msg := "waiting for the peer to initiate IKE"
		if info.Initiator {
			msg = "initiating IKE"
		}
		if since > noSAGrace {
			return cable.StateError, fmt.Sprintf("no IKE_SA %s after the connection was loaded (%s; check the peer's address, port and pre-shared key)", since.Truncate(time.Second), msg)
		}
		return cable.StateConnecting, msg
	}
	switch {
	case slices.Contains(ikeUsable, sa.State) && hasInstalled(sa):
		return cable.StateConnected, ""
	case slices.Contains(ikeUsable, sa.State):
		if sa.Established > noChildGrace {
			return cable.StateError, fmt.Sprintf("IKE_SA %s for %s but no CHILD_SA installed (traffic selectors or ESP proposals refused?)", sa.State, sa.Established)
		}
		return cable.StateConnecting, "IKE_SA " + sa.State + ", CHILD_SA not installed yet"
	case sa.State == "CONNECTING" || sa.State == "CREATED":
		if since > noSAGrace {
			return cable.StateError, fmt.Sprintf("IKE_SA still %s %s after the connection was loaded", sa.State, since.Truncate(time.Second))
		}
		return cable.StateConnecting, "IKE_SA " + sa.State
	default:
		return cable.StateError, "IKE_SA " + sa.State
	}
}
