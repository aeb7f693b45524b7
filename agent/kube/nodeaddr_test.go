package kube

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func node(name string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

func TestAddressesOfPicksInternalAndExternal(t *testing.T) {
	tests := []struct {
		name  string
		addrs []corev1.NodeAddress
		want  NodeAddresses
	}{
		{"both kinds", []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "gw1"}, {Type: corev1.NodeExternalIP, Address: "203.0.113.5"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.5"}},
			NodeAddresses{Private: netip.MustParseAddr("10.0.0.5"), Public: netip.MustParseAddr("203.0.113.5")}},
		{"IPv4 before IPv6 whatever the order", []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "fd00::5"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.5"}},
			NodeAddresses{Private: netip.MustParseAddr("10.0.0.5")}},
		{"only IPv6", []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "fd00::5"}},
			NodeAddresses{Private: netip.MustParseAddr("fd00::5")}},
		{"garbage is skipped", []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.300"}, {Type: corev1.NodeInternalIP, Address: "fe80::1%eth0"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.6"}},
			NodeAddresses{Private: netip.MustParseAddr("10.0.0.6")}},
		{"none", nil, NodeAddresses{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AddressesOf(node("n", tt.addrs...)); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestNodeWatcherFollowsItsOwnNode(t *testing.T) {
	client := fake.NewClientset(
		node("gw1", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}),
		node("other", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.9"}))
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan NodeAddresses, 8)
	done := make(chan error, 1)
	go func() {
		done <- (&NodeWatcher{Client: &fakeClient{kc: client}, Node: "gw1"}).Run(ctx, func(a NodeAddresses) { got <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	next := func(what string) NodeAddresses {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(10 * time.Second):
			t.Fatalf("no addresses within 10s: %s", what)
		}
		return NodeAddresses{}
	}
	if a := next("initial"); a.Private != netip.MustParseAddr("10.0.0.5") || a.Public.IsValid() {
		t.Fatalf("initial %+v", a)
	}
	// The other node changes: nothing for us. Ours gains an ExternalIP: handed out.
	if _, err := client.CoreV1().Nodes().Update(ctx, node("other", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.10"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Update(ctx, node("gw1",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.5"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if a := next("update"); a.Private != netip.MustParseAddr("10.0.0.5") || a.Public != netip.MustParseAddr("203.0.113.5") {
		t.Fatalf("after the update %+v", a)
	}
	select {
	case a := <-got:
		t.Fatalf("an extra hand-out %+v (the other node's change, or an unchanged one)", a)
	case <-time.After(300 * time.Millisecond):
	}
}

// FuzzAddressesOf: any address strings give valid-or-zero addresses without panicking.
func FuzzAddressesOf(f *testing.F) {
	f.Add("10.0.0.5", "203.0.113.5")
	f.Add("::ffff:10.0.0.1", "")
	f.Add("fe80::1%eth0", "x")
	f.Fuzz(func(t *testing.T, in, ex string) {
		a := AddressesOf(node("n", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: in}, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ex}))
		for _, ip := range []netip.Addr{a.Private, a.Public} {
			if ip.IsValid() && (ip.Zone() != "" || ip.Is4In6()) {
				t.Fatalf("%v from %q/%q", ip, in, ex)
			}
		}
	})
}
