package wireguard

import (
	"fmt"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
)

// rejectAfter is WireGuard's REJECT_AFTER_TIME: a session older than this carries no traffic, and
// with traffic or a persistent keepalive a handshake is renewed every REKEY_AFTER_TIME (120s).
// So a handshake older than this means the peer is not answering.
const rejectAfter = 180 * time.Second

// handshakeMargin absorbs the jitter WireGuard adds to rekeying and the time between the device
// reading its clock and us reading ours.
const handshakeMargin = 15 * time.Second

// peerStatuses reports every peer on the device, and every stored connection whose peer is
// deferred (not on the device yet, see handshake.go); the cluster and node names come from the
// stored connections. A peer no cluster claims is reported with an empty Cluster and an error
// state. pending are the peers deferred or held back. Pure: dev is what the device reported at
// now, mtu the link's.
func peerStatuses(dev *wgtypes.Device, conns map[string]storedConn, pending map[wgtypes.Key]addPlan, now time.Time, mtu int) []cable.ConnectionStatus {
	byKey := map[string]string{}
	for cluster, c := range conns {
		byKey[c.PublicKey] = cluster
	}
	out := make([]cable.ConnectionStatus, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		st := cable.ConnectionStatus{
			RxBytes:       uint64(max(p.ReceiveBytes, 0)),
			TxBytes:       uint64(max(p.TransmitBytes, 0)),
			LastHandshake: p.LastHandshakeTime,
			MTU:           mtu,
		}
		if p.Endpoint != nil {
			st.Endpoint = p.Endpoint.String()
		}
		st.Subnets, _ = prefixesFromIPNets(p.AllowedIPs)
		st.State, st.Message = connectionState(p.LastHandshakeTime, now, st.RxBytes)
		if cluster, ok := byKey[p.PublicKey.String()]; ok {
			st.Cluster = cluster
			st.Node = conns[cluster].Node
			if pending[p.PublicKey] == addHeld && st.State == cable.StateConnecting {
				st.Message = "waiting for first handshake (cluster " + cluster + "'s end initiates it, this end answers)"
			}
		} else {
			st.State = cable.StateError
			st.Message = fmt.Sprintf("peer %s belongs to no known cluster", p.PublicKey)
		}
		out = append(out, st)
	}
	for cluster, c := range conns {
		k, err := wgtypes.ParseKey(c.PublicKey)
		if err != nil || pending[k] != addLater || hasPeer(dev, k) {
			continue
		}
		out = append(out, cable.ConnectionStatus{
			Cluster: cluster, Node: c.Node, Endpoint: c.Endpoint, MTU: mtu, Subnets: c.Subnets,
			State:   cable.StateConnecting,
			Message: "waiting for first handshake (cluster " + cluster + "'s end initiates it; this end adds the peer in a moment)",
		})
	}
	cable.SortConnections(out)
	return out
}

// connectionState computes the state of one peer from what the device reports; lastHandshake is
// zero when the peer never completed a handshake.
//
// Connected means a handshake has completed, on this end, within REJECT_AFTER_TIME (plus a
// margin): the kernel and wireguard-go both record it when this end is the initiator and the
// response arrives, or when it is the responder and the initiator's first packet (data or
// keepalive) confirms the session. Until then the pair is connecting, whatever else the device
// says: a peer that answered a handshake has bytes received but no session it may send on yet.
func connectionState(lastHandshake, now time.Time, rxBytes uint64) (cable.State, string) {
	if !hasHandshake(lastHandshake) {
		if rxBytes > 0 {
			// Handshake messages (or, on a device that forgot an expired session's time, old
			// traffic) arrived, but no session: e.g. the two ends' first initiations crossed.
			return cable.StateConnecting, fmt.Sprintf("waiting for first handshake (%d bytes received from the peer, no session yet)", rxBytes)
		}
		return cable.StateConnecting, "waiting for first handshake"
	}
	age := now.Sub(lastHandshake)
	if age <= rejectAfter+handshakeMargin {
		// A handshake "in the future" (clock step) is treated as fresh.
		return cable.StateConnected, ""
	}
	msg := fmt.Sprintf("last handshake %s ago", age.Truncate(time.Second))
	if rxBytes == 0 {
		msg += ", nothing ever received from the peer"
	}
	return cable.StateError, msg
}
