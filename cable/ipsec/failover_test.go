package ipsec

import (
	"bytes"
	"context"
	"net/netip"
	"slices"
	"testing"
)

// TestConnectToAnotherPeerDoesNotWaitForTheOldOnesAnswer moves a pair to another gateway of the
// remote cluster, as a gateway failover does when the one it used died: the old SAs are
// terminated with the short wait (the dead peer never answers the DELETE; charon forces the
// SAs down), the error charon answers then does not fail the Connect, and the new peer's
// connection is loaded. A change that keeps the peer (new subnets) still waits the long time.
func TestConnectToAnotherPeerDoesNotWaitForTheOldOnesAnswer(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	remote := testRemote()
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}

	f.sas["cbl-west"] = true
	remote.Subnets = []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}

	f.sas["cbl-west"] = true
	f.deleteUnanswered = true
	old := remote.Address
	remote.Node, remote.Address = "west-gw2", netip.MustParseAddr("192.0.2.99")
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatalf("Connect to another peer failed on the unanswered DELETE to the old one: %v", err)
	}
	if want := []string{"5000", "100"}; !slices.Equal(f.terminateTimeouts, want) {
		t.Errorf("terminate timeouts %v, want %v: the long wait for a change on the same peer, the short one when the peer is replaced", f.terminateTimeouts, want)
	}
	if got := f.conns["cbl-west"]["remote_addrs"]; !slices.Equal(got.([]string), []string{remote.Address.String()}) {
		t.Errorf("charon's connection goes to %v, want the new peer %s (was %s)", got, remote.Address, old)
	}
	if f.sas["cbl-west"] {
		t.Error("the old peer's SA is still there")
	}
}
