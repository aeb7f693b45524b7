package broker

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Bad input at the broker's API. These tests use only what the API had before it was checked, so
// that they fail against a broker that does not check it.

// Defect 2: CIDRs that cut gateways off.
func TestClusterCIDRsThatWouldCutGatewaysOffAreRefused(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	gw := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	if _, err := gw.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")}); err != nil {
		t.Fatal(err)
	}
	before := len(b.list().Clusters)
	for _, tt := range []struct {
		name, pods, svcs string
		fragments        []string
	}{
		{"a pod CIDR holding a gateway's address", "192.0.2.0/24", "", []string{"192.0.2.0/24", "192.0.2.1", "gateway gw1", `"east"`}},
		{"a service CIDR holding a gateway's address", "10.9.0.0/16", "192.0.0.0/16", []string{"service CIDR 192.0.0.0/16", "192.0.2.1"}},
		{"a pod CIDR holding the broker's address", "127.0.0.0/8", "", []string{"127.0.0.0/8", "loopback"}},
		{"a default route", "0.0.0.0/0", "", []string{"0.0.0.0/0", "default route"}},
		{"the loopback range", "127.1.0.0/16", "", []string{"loopback"}},
		{"the link-local range", "169.254.0.0/16", "", []string{"link-local"}},
		{"the multicast range", "224.1.0.0/16", "", []string{"multicast"}},
		{"the unspecified range", "0.0.0.0/8", "", []string{"unspecified"}},
		{"IPv6 link-local", "fe80::/64", "", []string{"link-local"}},
		{"IPv6 multicast", "ff02::/16", "", []string{"multicast"}},
	} {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			req := &apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{tt.pods}}
			if tt.svcs != "" {
				req.ServiceCidrs = []string{tt.svcs}
			}
			_, err := b.admin.CreateJoinToken(ctxT(t), req)
			wantCode(t, err, codes.InvalidArgument, tt.fragments...)
		})
	}
	if n := len(b.list().Clusters); n != before {
		t.Fatalf("%d clusters after the refusals, had %d", n, before)
	}
	t.Run("a gateway whose address lies in a cluster's CIDR is refused", func(t *testing.T) {
		b.token("west", "10.2.0.0/16")
		w := mustJoin(t, b.addr, b.token("west"), "west", "gw1")
		for _, ip := range []string{"10.2.0.5", "10.1.7.7"} {
			_, err := w.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("west", "gw1", ip)})
			wantCode(t, err, codes.InvalidArgument, "private_ip "+ip, "lies inside pod CIDR")
		}
		e := endpoint("west", "gw1", "192.0.2.2")
		e.PublicIp = "10.1.0.1"
		_, err := w.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: e})
		wantCode(t, err, codes.InvalidArgument, "public_ip 10.1.0.1", `cluster "east"`)
		// The clusters' CIDRs are kept between registrations: a cluster created since is seen.
		if _, err := w.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("west", "gw1", "192.0.3.1")}); err != nil {
			t.Fatalf("a gateway outside every CIDR: %v", err)
		}
		b.token("north", "192.0.4.0/24")
		_, err = w.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("west", "gw1", "192.0.4.9")})
		wantCode(t, err, codes.InvalidArgument, "private_ip 192.0.4.9", "pod CIDR 192.0.4.0/24", `cluster "north"`)
	})
}

// Defect 3: unbounded input.
func TestEveryFieldIsBoundedAndTheRefusalNamesIt(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	b.token("east", "10.1.0.0/16")
	big := strings.Repeat("a", 5000)
	for _, tt := range []struct {
		name      string
		yaml      string
		fragments []string
	}{
		{"an option value", fmt.Sprintf(`
kind: ClusterConnectionPolicy
metadata: {name: big}
spec: {cableDriver: {name: ipsec, options: {ike_proposals: %s}}}
`, big), []string{`policy "big"`, "spec.cableDriver.options.ike_proposals", "5000 bytes, at most 1024"}},
		{"a selector", `
kind: ClusterConnectionPolicy
metadata: {name: wide}
spec: {clusterSelector: {matchExpressions: [{key: a, operator: In, values: [` + strings.TrimSuffix(strings.Repeat("x,", 65), ",") + `]}]}}
`, []string{`policy "wide"`, "matchExpressions[0].values: 65 values, at most 64"}},
	} {
		t.Run(tt.name+" too large is refused", func(t *testing.T) {
			_, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: policiesFromYAML(t, tt.yaml)})
			wantCode(t, err, codes.InvalidArgument, tt.fragments...)
		})
	}
	t.Run("a policy of more than 64 KiB is refused", func(t *testing.T) {
		p := policiesFromYAML(t, "kind: ClusterConnectionPolicy\nmetadata: {name: huge}\nspec: {}\n")[0]
		p.Json = append(p.Json[:len(p.Json)-1], []byte(`,"x":"`+strings.Repeat("y", 70000)+`"}`)...)
		_, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: []*apiv1.Policy{p}})
		wantCode(t, err, codes.InvalidArgument, `policy "huge"`, "bytes of JSON, at most 65536")
	})
	t.Run("too many labels are refused", func(t *testing.T) {
		set := map[string]string{}
		for i := range 65 {
			set[fmt.Sprintf("k%d", i)] = "v"
		}
		_, err := b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "east", Set: set})
		wantCode(t, err, codes.InvalidArgument, "65 label changes", "at most 64")
	})
	t.Run("an endpoint attribute too large is refused", func(t *testing.T) {
		a := mustJoin(t, b.addr, b.token("east"), "east", "gw1")
		e := endpoint("east", "gw1", "192.0.2.1")
		e.CableAttributes["wireguard"].Values["publicKey"] = big
		_, err := a.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: e})
		wantCode(t, err, codes.InvalidArgument, "cable_attributes", "at most 1024")
	})
	if _, ps, _ := b.policies(); len(ps) != 1 {
		t.Fatalf("refused policies were stored: %v", ps)
	}
}

// Defect 4: invalid cable drivers and options.
func TestUnknownDriversAndBadOptionsAreRefusedNamingThem(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	for _, tt := range []struct {
		name, driver, options string
		fragments             []string
	}{
		{"an unknown driver", "gre", "", []string{`policy "p"`, "spec.cableDriver.name", `"gre" is not a cable driver`, "ipsec, vxlan, vxlan+ipsec, wireguard"}},
		{"vni 0", "vxlan", "{vni: \"0\"}", []string{`policy "p"`, "spec.cableDriver.options", `vni="0"`}},
		{"an mtu of 100000", "vxlan", "{mtu: \"100000\"}", []string{"spec.cableDriver.options", `mtu="100000"`}},
		{"an option the driver does not know", "wireguard", "{foo: bar}", []string{"spec.cableDriver.options", `foo="bar"`, "unknown key"}},
	} {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			opts := ""
			if tt.options != "" {
				opts = ", options: " + tt.options
			}
			y := "kind: ClusterConnectionPolicy\nmetadata: {name: p}\nspec: {cableDriver: {name: " + tt.driver + opts + "}}\n"
			_, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: policiesFromYAML(t, y)})
			wantCode(t, err, codes.InvalidArgument, tt.fragments...)
		})
	}
	b.apply("kind: ClusterConnectionPolicy\nmetadata: {name: ok}\nspec: {cableDriver: {name: vxlan, options: {vni: \"200\", mtu: \"1400\"}}}\n")
	// A client that skips local validation (raw JSON) still meets the broker's.
	_, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: []*apiv1.Policy{{Name: "p",
		Json: []byte(`{"kind":"ClusterConnectionPolicy","metadata":{"name":"p"},"spec":{"cableDriver":{"name":"wireguard","options":{"mode":"bridge"}}}}`)}}})
	wantCode(t, err, codes.InvalidArgument, `policy "p"`, `spec.cableDriver.options.mode: "bridge" is not gateway or direct`)
	// mode is the policy's pair option: the driver never sees it, so no driver refuses it.
	for _, d := range []string{"wireguard", "vxlan", "ipsec", "vxlan+ipsec"} {
		b.apply("kind: ClusterConnectionPolicy\nmetadata: {name: gw}\nspec: {cableDriver: {name: " + d + ", options: {mode: gateway}}}\n")
	}
}

// Defect 5: a removed and re-created cluster gets new pair PSKs.
func TestARecreatedClusterGetsNewPairPSKs(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	b.token("west", "10.2.0.0/16")
	pskOfWest := func() []byte {
		t.Helper()
		w, err := east.Watch(ctxT(t), &apiv1.WatchRequest{})
		if err != nil {
			t.Fatal(err)
		}
		psk := clusterPSKs(recv(t, w).Events)["west"]
		if len(psk) != 32 {
			t.Fatalf("east's snapshot has west with PSK %x", psk)
		}
		return psk
	}
	old := pskOfWest()
	if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "west"}); err != nil {
		t.Fatal(err)
	}
	b.token("west", "10.2.0.0/16")
	if now := pskOfWest(); bytes.Equal(now, old) {
		t.Fatalf("west removed and created again still gets the PSK %x with east", now)
	}
}

func TestAPodCIDRHoldingTheBrokersOwnAddressIsRefused(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{selfAddrs: []netip.Addr{netip.MustParseAddr("172.31.0.1"), netip.MustParseAddr("fd00::1")}})
	for _, tt := range []struct{ pods, svcs, addr string }{
		{"172.31.0.0/24", "", "172.31.0.1"},
		{"172.16.0.0/12", "", "172.31.0.1"},
		{"10.9.0.0/16", "fd00::/64", "fd00::1"},
	} {
		req := &apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{tt.pods}}
		if tt.svcs != "" {
			req.ServiceCidrs = []string{tt.svcs}
		}
		_, err := b.admin.CreateJoinToken(ctxT(t), req)
		wantCode(t, err, codes.InvalidArgument, tt.addr, "an address of the broker itself")
	}
	b.token("east", "10.1.0.0/16")
}
