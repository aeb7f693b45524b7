package ipsecdriver

import (
	"time"

	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
)

// Status is what testpeer writes and the test reads. Its Error is the error of the last action
// (Connect, Disconnect, Cleanup).
type Status struct {
	peer.Status[ipsec.Stats]
	CharonPID  int    `json:"charonPID"`
	Datapath   string `json:"datapath"`
	MTU        int    `json:"mtu"`
	ViciSocket string `json:"viciSocket"`
	// Links is the driver's Links() after Init (the agent clamps the TCP MSS on them).
	Links            []string `json:"links"`
	ConnectionsError string   `json:"connectionsError,omitempty"`
	// With -hold: Ready once Init is done and the testpeer waits for SIGUSR1 to Connect;
	// ConnectReturned when the first Connect returned; Installed when the testpeer first saw the
	// connection connected (zero if not within 30s).
	Ready           bool      `json:"ready,omitempty"`
	ConnectReturned time.Time `json:"connectReturned"`
	Installed       time.Time `json:"installed"`
}
