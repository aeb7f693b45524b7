package wireguard

import (
	"fmt"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// rejectAfter is WireGuard's REJECT_AFTER_TIME: a session older than this carries no traffic, and
// with traffic or a persistent keepalive a handshake is renewed every REKEY_AFTER_TIME (120s).
// So a handshake older than this means the peer is not answering.
const rejectAfter = 180 * time.Second

// handshakeMargin absorbs the jitter WireGuard adds to rekeying and the time between the device
// reading its clock and us reading ours.
const handshakeMargin = 15 * time.Second

// connectionState computes the state of one peer from what the device reports. It is pure so it
// can be table-tested; lastHandshake is zero when the peer never completed a handshake.
func connectionState(lastHandshake, now time.Time, rxBytes uint64) (cable.State, string) {
	if lastHandshake.IsZero() || lastHandshake.Unix() <= 0 {
		if rxBytes > 0 {
			// Can happen when a session expired and the counters remain from an earlier one on a
			// device that forgot the handshake time; still no usable session.
			return cable.StateConnecting, fmt.Sprintf("waiting for first handshake (%d bytes received earlier)", rxBytes)
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
