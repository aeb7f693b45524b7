package vxlandriver

import (
	"github.com/cablemesh/cablemesh/cable/vxlan"
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
)

// Status is what `testpeer peer` writes and the test reads.
type Status struct {
	peer.Status[vxlan.Stats]
	VTEP      string      `json:"vtep"`
	MTU       int         `json:"mtu"`
	Port      uint16      `json:"port"`
	AfterInit vxlan.Stats `json:"afterInit"`
	Options   string      `json:"options"`
}

// MultiStatus is what `testpeer multi` writes (its Connect stats stay zero).
type MultiStatus struct {
	peer.Status[vxlan.Stats]
	LastSeq int `json:"lastSeq"`
}

// Remote is one entry of multi's -remotes.
type Remote struct {
	Cluster string            `json:"cluster"`
	Address string            `json:"address"`
	Port    uint16            `json:"port"`
	Subnets []string          `json:"subnets"`
	Options map[string]string `json:"options,omitempty"`
}

// Command is what multi runs on SIGUSR1: connect (a cluster of -remotes, with Options),
// disconnect (a cluster) or cleanup.
type Command struct {
	Seq     int               `json:"seq"`
	Action  string            `json:"action"`
	Cluster string            `json:"cluster"`
	Options map[string]string `json:"options,omitempty"`
}

// Transfer is what testpeer's sink and source print.
type Transfer struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}
