package wgdriver

import (
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
	// Handshakes is what the driver did for the first handshake of the pair.
	Handshakes wireguard.HandshakeStats `json:"handshakes"`
}
