package xds

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestNodeTableIsBoundedAndForgets(t *testing.T) {
	now := time.Unix(1000, 0)
	tb := newNodeTable(3, time.Minute)
	for i := range 3 {
		if _, isNew, _, err := tb.admit(streamKey{id: int64(i)}, fmt.Sprintf("n%d", i), true, now); err != nil || !isNew {
			t.Fatalf("node %d: new %v err %v", i, isNew, err)
		}
	}
	// Full, every node with an open stream: a fourth is refused.
	if _, _, _, err := tb.admit(streamKey{id: 9}, "n9", true, now); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("fourth node: %v, want ResourceExhausted", err)
	}
	// A second stream of a known node is no new node.
	if id, isNew, _, err := tb.admit(streamKey{delta: true, id: 0}, "n0", true, now); err != nil || isNew || id != "n0" {
		t.Fatalf("second stream of n0: %q new %v err %v", id, isNew, err)
	}
	// A stream may not change its node.
	if _, _, _, err := tb.admit(streamKey{id: 1}, "other", true, now); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("node change: %v", err)
	}
	// Later requests without a node are the stream's node.
	if id, _, _, err := tb.admit(streamKey{id: 1}, "", false, now); err != nil || id != "n1" {
		t.Fatalf("request without node: %q %v", id, err)
	}
	// n1 and n2 go idle; a new node evicts the one idle longest (n1).
	tb.closed(streamKey{id: 1}, now)
	tb.closed(streamKey{id: 2}, now.Add(time.Second))
	_, _, dropped, err := tb.admit(streamKey{id: 10}, "n10", true, now.Add(2*time.Second))
	if err != nil || len(dropped) != 1 || dropped[0] != "n1" {
		t.Fatalf("eviction: dropped %v err %v", dropped, err)
	}
	// After the TTL the idle n2 expires on its own; n0 still has a stream open.
	if got := tb.expire(now.Add(2 * time.Minute)); len(got) != 1 || got[0] != "n2" {
		t.Fatalf("expired %v, want [n2]", got)
	}
	tb.closed(streamKey{id: 0}, now)
	if tb.streamsOf("n0") != 1 {
		t.Fatalf("n0 streams %d, want 1 (its delta stream)", tb.streamsOf("n0"))
	}
	if len(tb.nodes) > 3 {
		t.Fatalf("table holds %d nodes", len(tb.nodes))
	}
}

func TestNodeTableRefusesBadNodeIDs(t *testing.T) {
	tb := newNodeTable(3, time.Minute)
	for _, id := range []string{strings.Repeat("x", MaxNodeIDLength+1), "a\nb", "\xff"} {
		if _, _, _, err := tb.admit(streamKey{id: 1}, id, true, time.Now()); status.Code(err) != codes.InvalidArgument {
			t.Errorf("node id %q: %v, want InvalidArgument", id, err)
		}
	}
	if _, _, _, err := tb.admit(streamKey{id: 2}, "", false, time.Now()); status.Code(err) != codes.InvalidArgument {
		t.Errorf("first request without a node: %v", err)
	}
}

func TestAccessAllows(t *testing.T) {
	if !(Access{}).allows(0, 0) {
		t.Error("root refused")
	}
	if (Access{}).allows(65534, 65534) {
		t.Error("nobody allowed without an allowance")
	}
	if !(Access{UID: 101}).allows(101, 5) || (Access{UID: 101}).allows(102, 101) {
		t.Error("allowUID")
	}
	if !(Access{GID: 101}).allows(500, 101) || (Access{GID: 101}).allows(101, 500) {
		t.Error("allowGID")
	}
}

// FuzzNodeTableAdmit: whatever node IDs clients send, the table stays within its bound and
// refuses IDs that would garble the status.
func FuzzNodeTableAdmit(f *testing.F) {
	for _, s := range []string{"envoy", "", "a\nb", strings.Repeat("x", 300), "\xff\xfe"} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, id string, n uint8) {
		tb := newNodeTable(4, time.Minute)
		now := time.Unix(0, 0)
		for i := range int(n%16) + 1 {
			node := fmt.Sprintf("%s-%d", id, i)
			got, _, _, err := tb.admit(streamKey{id: int64(i)}, node, true, now)
			if err == nil && got != node {
				t.Fatalf("admitted %q as %q", node, got)
			}
			if err == nil && (len(node) > MaxNodeIDLength || strings.ContainsAny(node, "\n\r\x00")) {
				t.Fatalf("admitted a bad node id %q", node)
			}
			if i%2 == 0 {
				tb.closed(streamKey{id: int64(i)}, now)
			}
			if len(tb.nodes) > 4 {
				t.Fatalf("%d nodes in a table of 4", len(tb.nodes))
			}
		}
	})
}
