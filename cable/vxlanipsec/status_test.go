package vxlanipsec

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/cable"
)

func TestStatusIsConnectedOnlyWhenVXLANIPsecAndGuardAllAre(t *testing.T) {
	hs := time.Date(2026, 11, 23, 19, 0, 0, 0, time.UTC)
	vx := cable.ConnectionStatus{Cluster: "west", Endpoint: "192.168.0.2:4799", State: cable.StateConnected, MTU: 1413, RxBytes: 10, TxBytes: 20,
		Subnets: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}}
	sa := cable.ConnectionStatus{Cluster: "west", Endpoint: "192.168.0.2:4510", State: cable.StateConnected, LastHandshake: hs, MTU: 1438}
	guarded := map[string]map[string]bool{"west": {"out": true, "in": true}}
	tests := []struct {
		name      string
		vs, ss    []cable.ConnectionStatus
		guards    map[string]map[string]bool
		wantState cable.State
		wantMsg   string
	}{
		{"both halves up and guarded is connected", []cable.ConnectionStatus{vx}, []cable.ConnectionStatus{sa}, guarded, cable.StateConnected, ""},
		{"an IPsec SA still negotiating is connecting", []cable.ConnectionStatus{vx},
			[]cable.ConnectionStatus{{Cluster: "west", State: cable.StateConnecting, Message: "IKE_SA CONNECTING"}}, guarded, cable.StateConnecting, "IPsec connecting: IKE_SA CONNECTING"},
		{"no IPsec connection is an error", []cable.ConnectionStatus{vx}, nil, guarded, cable.StateError, "charon holds no transport-mode connection"},
		{"a missing guard is an error even with the SA up", []cable.ConnectionStatus{vx}, []cable.ConnectionStatus{sa},
			map[string]map[string]bool{"west": {"out": true}}, cable.StateError, "guard policy in missing"},
		{"a VXLAN error wins over IPsec connecting", []cable.ConnectionStatus{{Cluster: "west", Endpoint: vx.Endpoint, State: cable.StateError, Message: "device cbl-vi100 is missing"}},
			[]cable.ConnectionStatus{{Cluster: "west", State: cable.StateConnecting}}, guarded, cable.StateError, "VXLAN: device cbl-vi100 is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := combine(tt.vs, tt.ss, tt.guards)
			if len(got) != 1 {
				t.Fatalf("%d statuses, want 1: %+v", len(got), got)
			}
			if got[0].State != tt.wantState || !strings.Contains(got[0].Message, tt.wantMsg) || (tt.wantMsg == "" && got[0].Message != "") {
				t.Errorf("state %s message %q, want %s containing %q", got[0].State, got[0].Message, tt.wantState, tt.wantMsg)
			}
		})
	}
	got := combine([]cable.ConnectionStatus{vx}, []cable.ConnectionStatus{sa}, guarded)[0]
	if got.Endpoint != sa.Endpoint || !got.LastHandshake.Equal(hs) || got.MTU != vx.MTU || got.RxBytes != 10 || len(got.Subnets) != 1 {
		t.Errorf("merged %+v: want IPsec's endpoint and handshake, VXLAN's MTU, counters and subnets", got)
	}
	orphan := combine(nil, []cable.ConnectionStatus{sa}, nil)
	if len(orphan) != 1 || orphan[0].State != cable.StateError || !strings.Contains(orphan[0].Message, "without its VXLAN connection") {
		t.Errorf("an IPsec connection alone: %+v", orphan)
	}
}

func TestGuardPoliciesBlockThePairsVXLANPortsOnly(t *testing.T) {
	l, r := netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("192.168.0.2")
	ps := guardPolicies(l, r, 4799, 4800)
	if len(ps) != 2 {
		t.Fatalf("%d policies", len(ps))
	}
	out, in := ps[0], ps[1]
	if out.Dir != netlink.XFRM_DIR_OUT || out.Src.String() != "192.168.0.1/32" || out.Dst.String() != "192.168.0.2/32" || out.DstPort != 4800 || out.SrcPort != 0 {
		t.Errorf("out policy %v: want 192.168.0.1 -> 192.168.0.2 udp dport 4800, any source port", out)
	}
	if in.Dir != netlink.XFRM_DIR_IN || in.Src.String() != "192.168.0.2/32" || in.Dst.String() != "192.168.0.1/32" || in.DstPort != 4799 {
		t.Errorf("in policy %v: want 192.168.0.2 -> 192.168.0.1 udp dport 4799", in)
	}
	for _, p := range ps {
		if p.Action != netlink.XFRM_POLICY_BLOCK || p.Priority != guardPriority || p.Proto != 17 {
			t.Errorf("policy %v: want a udp block policy at priority %d", p, guardPriority)
		}
	}
	if !isHost(out.Src, l) || isHost(out.Src, r) {
		t.Errorf("isHost")
	}
}

// TestInitRefusesAKernelWithoutESP: where the kernel has no ESP the driver does not start (no
// charon, no link) and says why, naming kernel-libipsec's missing transport mode; the agent shows
// this error for the driver and for every pair put on it.
func TestInitRefusesAKernelWithoutESP(t *testing.T) {
	dir := t.TempDir()
	d, err := NewDriver(cable.LocalNode{Cluster: "east", Node: "gw", StateDir: dir, AdvertiseAddress: netip.MustParseAddr("192.168.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.hasESP = func() (bool, error) {
		return false, errors.New(`add probe ESP state spi 0xcb000001: protocol not supported`)
	}
	err = d.Init(context.Background())
	if !errors.Is(err, ErrNoKernelESP) {
		t.Fatalf("Init = %v, want ErrNoKernelESP", err)
	}
	for _, want := range []string{"vxlan+ipsec init", "no transport mode", "kernel-libipsec", "probe: add probe ESP state"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Init error %q does not say %q", err, want)
		}
	}
	if err := d.Connect(context.Background(), cable.RemoteEndpoint{Cluster: "west", Address: netip.MustParseAddr("192.168.0.2"),
		Attributes: map[string]string{AttrVXLANPort: "4799"}}, nil); !errors.Is(err, cable.ErrNotInitialised) {
		t.Errorf("Connect after a refused Init = %v, want ErrNotInitialised", err)
	}
	if le := d.LocalEndpoint(); le.Port != DefaultIKEPort || le.Attributes[AttrVXLANPort] != "4799" {
		t.Errorf("LocalEndpoint %+v", le)
	}
	if l := d.Links(); len(l) != 1 || l[0] != "cbl-vi*" {
		t.Errorf("Links %v", l)
	}
}

// TestAMissingCharonIsThisDriversSetting: the embedded charon's error names the setting as the
// operator wrote it, vxlan+ipsec.charon, not the ipsec driver's.
func TestAMissingCharonIsThisDriversSetting(t *testing.T) {
	d, err := NewDriver(cable.LocalNode{Cluster: "east", Node: "gw", StateDir: t.TempDir(), AdvertiseAddress: netip.MustParseAddr("192.168.0.1")},
		cable.Settings{"charon": "/nonexistent/charon"})
	if err != nil {
		t.Fatal(err)
	}
	d.hasESP = func() (bool, error) { return true, nil }
	err = d.Init(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), `vxlan+ipsec.charon: "/nonexistent/charon" is no charon executable`) {
		t.Errorf("Init = %v, want the vxlan+ipsec.charon setting named", err)
	}
}
