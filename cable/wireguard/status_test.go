package wireguard

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

func TestConnectionState(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		handshake time.Time
		rx        uint64
		want      cable.State
		wantMsg   string
	}{
		{"a peer that never shook hands is connecting", time.Time{}, 0, cable.StateConnecting, "waiting for first handshake"},
		{"the Unix epoch counts as never", time.Unix(0, 0), 0, cable.StateConnecting, "waiting for first handshake"},
		{"a peer with bytes but no handshake time is still connecting", time.Time{}, 100, cable.StateConnecting, "waiting for first handshake"},
		{"a handshake a second ago is connected", now.Add(-time.Second), 10, cable.StateConnected, ""},
		{"a handshake 2 minutes ago is connected", now.Add(-2 * time.Minute), 10, cable.StateConnected, ""},
		{"a handshake exactly 180s ago is connected", now.Add(-180 * time.Second), 10, cable.StateConnected, ""},
		{"a handshake within the margin is connected", now.Add(-194 * time.Second), 10, cable.StateConnected, ""},
		{"a handshake past the margin is an error", now.Add(-196 * time.Second), 10, cable.StateError, "last handshake 3m16s ago"},
		{"a handshake an hour ago is an error", now.Add(-time.Hour), 10, cable.StateError, "last handshake 1h0m0s ago"},
		{"an old handshake with nothing received says so", now.Add(-time.Hour), 0, cable.StateError, "nothing ever received"},
		{"a handshake in the future (clock step) is connected", now.Add(time.Minute), 10, cable.StateConnected, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := connectionState(tt.handshake, now, tt.rx)
			if got != tt.want {
				t.Errorf("state = %s (%q), want %s", got, msg, tt.want)
			}
			if tt.wantMsg == "" && msg != "" {
				t.Errorf("message = %q, want none", msg)
			}
			if !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("message = %q, want it to contain %q", msg, tt.wantMsg)
			}
		})
	}
}
