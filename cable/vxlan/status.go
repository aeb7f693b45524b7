package vxlan

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// deviceView is what Connections read of one link, once per call.
type deviceView struct {
	err       error // reading the device failed
	found, up bool
	rx, tx    uint64
	fdb       []fdbEntry
	neigh     []neighEntry
	routes    []route.Spec
}

// connectionStatuses judges every stored connection from the views of the links (by device
// name), and reports the FDB entries on our links that no connection owns as errors without a
// cluster. Pure.
func connectionStatuses(conns map[string]conn, views map[string]deviceView) []cable.ConnectionStatus {
	users := map[string]int{}
	known := map[string]map[netip.Addr]bool{}
	for _, c := range conns {
		users[c.Device]++
		if known[c.Device] == nil {
			known[c.Device] = map[netip.Addr]bool{}
		}
		known[c.Device][c.Address] = true
	}
	out := make([]cable.ConnectionStatus, 0, len(conns))
	for cluster, c := range conns {
		v := views[c.Device]
		st := cable.ConnectionStatus{
			Cluster:  cluster,
			Node:     c.Node,
			Endpoint: netip.AddrPortFrom(c.Address, uint16(c.DstPort)).String(),
			RxBytes:  v.rx,
			TxBytes:  v.tx,
			MTU:      c.MTU,
			Subnets:  slices.Clone(c.Subnets),
		}
		st.State, st.Message = connState(c.Device, observe(c, v, users[c.Device]-1))
		if v.err != nil {
			st.State, st.Message = cable.StateError, v.err.Error()
		}
		out = append(out, st)
	}
	for name, v := range views {
		for _, e := range v.fdb {
			if e.MAC == zeroMAC && !known[name][e.Dst] {
				out = append(out, cable.ConnectionStatus{
					Endpoint: netip.AddrPortFrom(e.Dst, uint16(e.Port)).String(),
					State:    cable.StateError,
					Message:  fmt.Sprintf("FDB entry %s on %s belongs to no known cluster", e, name),
				})
			}
		}
	}
	cable.SortConnections(out)
	return out
}

// observation is what Connections found on the host for one connection.
type observation struct {
	DeviceFound, DeviceUp bool
	MissingFDB            []fdbEntry
	MissingNeigh          []neighEntry
	MissingRoutes         []netip.Prefix
	// SharedWith is how many other connections use the same device (and so its counters).
	SharedWith int
}

// observe compares what c needs with what its link's view holds.
func observe(c conn, v deviceView, sharedWith int) observation {
	obs := observation{DeviceFound: v.found, DeviceUp: v.up, SharedWith: sharedWith}
	for _, e := range wantedFDB(c) {
		if !slices.Contains(v.fdb, e) {
			obs.MissingFDB = append(obs.MissingFDB, e)
		}
	}
	if n := wantedNeigh(c); !slices.Contains(v.neigh, n) {
		obs.MissingNeigh = append(obs.MissingNeigh, n)
	}
	gw := c.remoteVTEP()
	for _, s := range c.Subnets {
		if !slices.ContainsFunc(v.routes, func(r route.Spec) bool { return r.Dst == s && r.Gw == gw }) {
			obs.MissingRoutes = append(obs.MissingRoutes, s)
		}
	}
	return obs
}

// connState turns an observation into a state. VXLAN has no handshake: "connected" means the
// kernel holds everything traffic needs (device up, FDB, neighbor, routes). Whether the remote
// answers is for the health probes to tell.
func connState(device string, o observation) (cable.State, string) {
	var missing []string
	switch {
	case !o.DeviceFound:
		return cable.StateError, fmt.Sprintf("device %s is missing", device)
	case !o.DeviceUp:
		missing = append(missing, fmt.Sprintf("device %s is down", device))
	}
	for _, e := range o.MissingFDB {
		missing = append(missing, "no FDB entry "+e.String())
	}
	for _, n := range o.MissingNeigh {
		missing = append(missing, "no neighbor "+n.String())
	}
	for _, r := range o.MissingRoutes {
		missing = append(missing, "no route to "+r.String())
	}
	if len(missing) > 0 {
		return cable.StateError, strings.Join(missing, "; ")
	}
	if o.SharedWith > 0 {
		return cable.StateConnected, fmt.Sprintf("rx/tx are the counters of device %s, shared with %d other connection(s)", device, o.SharedWith)
	}
	return cable.StateConnected, ""
}
