package wgdriver

import (
	"time"

	"github.com/cablemesh/cablemesh/cable/wireguard"
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
)

// Status is what testpeer writes and the test reads.
type Status struct {
	peer.Status[wireguard.Stats]
	Kind         string `json:"kind"`
	PublicKey    string `json:"publicKey"`
	Port         uint16 `json:"port"`
	SocketExists bool   `json:"socketExists"`
	// InitDone is set, with -connect-at, once Init returned and before the wait for Connect.
	InitDone bool `json:"initDone"`
	// ConnectLate says by how much Init overran -connect-at ("" when it did not).
	ConnectLate string `json:"connectLate,omitempty"`
	// ConnectStarted is when the first Connect began.
	ConnectStarted time.Time `json:"connectStarted"`
}
