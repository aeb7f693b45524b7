package ipsecdriver

import (
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
)

// Status is what testpeer writes and the test reads. Its Error is the error of the last action
// (Connect, Disconnect, Cleanup).
type Status struct {
	peer.Status[ipsec.Stats]
	CharonPID        int    `json:"charonPID"`
	Datapath         string `json:"datapath"`
	MTU              int    `json:"mtu"`
	ViciSocket       string `json:"viciSocket"`
	ConnectionsError string `json:"connectionsError,omitempty"`
}
