package admission

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
	_ "github.com/cablemesh/cablemesh/cable/specs" // endpoints are checked against what each driver publishes
)

var (
	eastGW1 = pki.Identity{Cluster: "east", ClusterUID: "uid-east", Node: "gw1"}
	leases  = Leases{Default: 30 * time.Second, Max: 5 * time.Minute}
)

func endpoint(cluster, node string, subnets ...string) *apiv1.Endpoint {
	return &apiv1.Endpoint{
		Cluster: cluster, Node: node, PrivateIp: "192.0.2.1",
		CablePorts:      map[string]uint32{"wireguard": 51820},
		CableAttributes: map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}}},
		Drivers:         []string{"wireguard"},
		Subnets:         subnets,
	}
}

func TestAdmitEndpointRefusesBadFieldsNamingThem(t *testing.T) {
	mod := func(f func(e *apiv1.Endpoint)) *apiv1.Endpoint {
		e := endpoint("east", "gw1", "10.1.0.0/16")
		f(e)
		return e
	}
	tests := []struct {
		name     string
		e        *apiv1.Endpoint
		lease    int64
		field    string
		fragment string
	}{
		{"a missing endpoint", nil, 0, "endpoint", "endpoint is missing"},
		{"a missing private IP", mod(func(e *apiv1.Endpoint) { e.PrivateIp = "" }), 0, "private_ip", "endpoint east/gw1: private_ip is empty"},
		{"a bad private IP", mod(func(e *apiv1.Endpoint) { e.PrivateIp = "10.0.0.300" }), 0, "private_ip", `private_ip "10.0.0.300" is not an IP address`},
		{"a bad public IP", mod(func(e *apiv1.Endpoint) { e.PublicIp = "x" }), 0, "public_ip", `public_ip "x"`},
		{"a bad health-check IP", mod(func(e *apiv1.Endpoint) { e.HealthCheckIp = "x" }), 0, "health_check_ip", `health_check_ip "x"`},
		{"port zero", mod(func(e *apiv1.Endpoint) { e.CablePorts["wireguard"] = 0 }), 0, "cable_ports", `cable_ports["wireguard"] = 0 is not a port`},
		{"a port above 65535", mod(func(e *apiv1.Endpoint) { e.CablePorts["wireguard"] = 70000 }), 0, "cable_ports", "70000"},
		{"a port key that is no driver name", mod(func(e *apiv1.Endpoint) { e.CablePorts["a b"] = 1 }), 0, "cable_ports", `cable_ports key "a b" is not a driver name`},
		{"an empty driver", mod(func(e *apiv1.Endpoint) { e.Drivers = []string{""} }), 0, "drivers", `drivers entry "" is not a driver name`},
		{"attributes of an unknown driver", mod(func(e *apiv1.Endpoint) { e.SetAttributes("gre", map[string]string{"a": "b"}) }), 0, "cable_attributes", `cable_attributes key "gre" is not a registered cable driver (have ipsec, vxlan, vxlan+ipsec, wireguard)`},
		{"a bad WireGuard key", mod(func(e *apiv1.Endpoint) { e.SetAttributes("wireguard", map[string]string{"publicKey": "abc"}) }), 0, "cable_attributes", `wireguard publicKey "abc"`},
		{"a malformed subnet", mod(func(e *apiv1.Endpoint) { e.Subnets = []string{"10.1.0.1/16"} }), 0, "subnets", "host bits"},
		{"a negative lease of the endpoint", mod(func(e *apiv1.Endpoint) { e.LeaseSeconds = -1 }), 0, "lease_seconds", "endpoint east/gw1: lease_seconds -1 is negative"},
		{"a negative lease asked for", mod(func(e *apiv1.Endpoint) {}), -5, "lease_seconds", "lease_seconds -5"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, _, err := AdmitEndpoint(eastGW1, &apiv1.RegisterEndpointRequest{Endpoint: tt.e, LeaseSeconds: tt.lease}, leases, t0)
			if e := wantErr[*InvalidError](t, err, tt.fragment); e.Field != tt.field {
				t.Fatalf("field %q, want %q", e.Field, tt.field)
			}
		})
	}
}

func TestAnAgentMayRegisterOnlyItsOwnEndpoint(t *testing.T) {
	for _, e := range []*apiv1.Endpoint{endpoint("west", "gw1"), endpoint("east", "gw2"), endpoint("", "gw2")} {
		_, _, err := AdmitEndpoint(eastGW1, &apiv1.RegisterEndpointRequest{Endpoint: e}, leases, t0)
		fe := wantErr[*ForbiddenError](t, err, "agent east/gw1 may write only its own endpoint east/gw1, not endpoint ")
		if fe.Caller != "agent east/gw1" || fe.Target == "east/gw1" {
			t.Fatalf("forbidden %+v", fe)
		}
	}
}

func TestAdmitEndpointFillsItsIdentityAndLease(t *testing.T) {
	tests := []struct {
		name      string
		asked     int64
		wantLease time.Duration
	}{
		{"no lease asked for gets the default", 0, 30 * time.Second},
		{"a lease within the maximum is kept", 90, 90 * time.Second},
		{"a lease above the maximum is cut to it", 3600, 5 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := endpoint("", "", "10.1.0.0/24")
			in.Revision, in.LeaseSeconds = 9, 0
			e, secs, err := AdmitEndpoint(eastGW1, &apiv1.RegisterEndpointRequest{Endpoint: in, LeaseSeconds: tt.asked}, leases, t0)
			if err != nil {
				t.Fatal(err)
			}
			if e.Cluster != "east" || e.Node != "gw1" || e.Revision != 0 || secs != int64(tt.wantLease/time.Second) || e.LeaseSeconds != secs ||
				!e.LastHeartbeat.AsTime().Equal(t0) || !e.LeaseExpires.AsTime().Equal(t0.Add(tt.wantLease)) {
				t.Fatalf("admitted %v lease %d; want east/gw1, revision 0, lease %v from %v", e, secs, tt.wantLease, t0)
			}
			if in.Cluster != "" || in.LastHeartbeat != nil {
				t.Fatal("AdmitEndpoint modified the request")
			}
		})
	}
}

func TestPlaceEndpoint(t *testing.T) {
	east := &apiv1.Cluster{Name: "east", Uid: "uid-east", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}}
	admitted := func(subnets ...string) *apiv1.Endpoint {
		e, _, err := AdmitEndpoint(eastGW1, &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", subnets...)}, leases, t0)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	stored := proto.Clone(admitted("10.1.0.0/24")).(*apiv1.Endpoint)
	stored.Revision = 5
	stored.LeaseExpires = timestamppb.New(t0.Add(-time.Hour))
	tests := []struct {
		name          string
		e             *apiv1.Endpoint
		c             *apiv1.Cluster
		old           *apiv1.Endpoint
		wantRenewOnly bool
		wantErr       string
	}{
		{"a new endpoint is put", admitted("10.1.0.0/24", "10.96.0.0/16"), east, nil, false, ""},
		{"the same endpoint again only renews its lease", admitted("10.1.0.0/24"), east, stored, true, ""},
		{"a changed endpoint is put", admitted("10.1.1.0/24"), east, stored, false, ""},
		{"a subnet outside the cluster's CIDRs is refused", admitted("10.2.0.0/24"), east, nil, false,
			`endpoint east/gw1: subnet 10.2.0.0/24 is not inside the pod CIDRs [[10.1.0.0/16]] or service CIDRs [[10.96.0.0/16]] of cluster "east"`},
		{"a removed cluster refuses the credential", admitted(), nil, nil, false, `cluster "east" was removed from the mesh`},
		{"a recreated cluster refuses the credential", admitted(), &apiv1.Cluster{Name: "east", Uid: "uid-2"}, nil, false, `cluster "east" was removed from the mesh`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			renewOnly, err := PlaceEndpoint(eastGW1, tt.e, tt.c, tt.old)
			switch {
			case tt.wantErr == "":
				if err != nil || renewOnly != tt.wantRenewOnly {
					t.Fatalf("renewOnly=%v err=%v, want %v", renewOnly, err, tt.wantRenewOnly)
				}
			case tt.c == nil || tt.c.Uid != eastGW1.ClusterUID:
				wantErr[*CredentialError](t, err, tt.wantErr)
			default:
				wantErr[*InvalidError](t, err, tt.wantErr)
			}
		})
	}
}

func TestHeartbeatsRenewTheLeaseOfTheAgentsOwnEndpoint(t *testing.T) {
	if n, err := HeartbeatNode(eastGW1, ""); err != nil || n != "gw1" {
		t.Fatalf("no node: %q %v, want gw1", n, err)
	}
	_, err := HeartbeatNode(eastGW1, "gw2")
	wantErr[*ForbiddenError](t, err, "agent east/gw1 may heartbeat only its own endpoint east/gw1, not east/gw2")

	_, err = RenewLease("east", "gw1", nil, leases.Default, t0)
	if e := wantErr[*NotFoundError](t, err, "endpoint east/gw1 is not registered", "register it again"); e.Kind != "endpoint" || e.Names[0] != "east/gw1" {
		t.Fatalf("not found %+v", e)
	}
	for _, tt := range []struct {
		leaseSeconds int64
		want         time.Duration
	}{{2, 2 * time.Second}, {0, leases.Default}} {
		e := &apiv1.Endpoint{Cluster: "east", Node: "gw1", LeaseSeconds: tt.leaseSeconds, Revision: 4}
		got, err := RenewLease("east", "gw1", e, leases.Default, t0)
		if err != nil || !got.LeaseExpires.AsTime().Equal(t0.Add(tt.want)) || !got.LastHeartbeat.AsTime().Equal(t0) || got.Revision != 4 || e.LeaseExpires != nil {
			t.Fatalf("renew with lease_seconds %d: %v %v; want expiry %v, the stored endpoint untouched", tt.leaseSeconds, got, err, t0.Add(tt.want))
		}
	}
}

func TestLeasesExpireAndAreExtendedAtStart(t *testing.T) {
	at := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	eps := []*apiv1.Endpoint{
		{Cluster: "a", Node: "past", LeaseExpires: at(-time.Second), LeaseSeconds: 5},
		{Cluster: "a", Node: "now", LeaseExpires: at(0)},
		{Cluster: "a", Node: "future", LeaseExpires: at(time.Second)},
		{Cluster: "a", Node: "never"},
	}
	exp := Expired(eps, t0)
	if len(exp) != 1 || exp[0].Node != "past" {
		t.Fatalf("expired %v, want only the one whose lease ended before now", exp)
	}
	ext := ExtendLeases(eps, 30*time.Second, t0.Add(time.Hour))
	if len(ext) != 4 || !ext[0].LeaseExpires.AsTime().Equal(t0.Add(time.Hour+5*time.Second)) || !ext[3].LeaseExpires.AsTime().Equal(t0.Add(time.Hour+30*time.Second)) {
		t.Fatalf("extended %v: want each endpoint's own lease (or the default) from the start time", ext)
	}
	if len(Expired(ext, t0.Add(time.Hour))) != 0 || !eps[0].LeaseExpires.AsTime().Equal(t0.Add(-time.Second)) {
		t.Fatal("extended leases expire at once, or the stored endpoints were modified")
	}
}

func TestShortestLeaseIsAmongTheEndpointsNotExpired(t *testing.T) {
	at := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	for _, tt := range []struct {
		name string
		eps  []*apiv1.Endpoint
		want time.Duration
	}{
		{"no endpoints have none", nil, 0},
		{"endpoints without a lease period have none", []*apiv1.Endpoint{{Node: "a", LeaseExpires: at(time.Second)}, {Node: "b"}}, 0},
		{"the shortest of the live leases", []*apiv1.Endpoint{
			{Node: "a", LeaseExpires: at(time.Second), LeaseSeconds: 30},
			{Node: "b", LeaseExpires: at(time.Second), LeaseSeconds: 5},
			{Node: "c", LeaseSeconds: 10},
		}, 5 * time.Second},
		{"an expired endpoint's lease is left out", []*apiv1.Endpoint{
			{Node: "a", LeaseExpires: at(-time.Second), LeaseSeconds: 2},
			{Node: "b", LeaseExpires: at(0), LeaseSeconds: 7},
		}, 7 * time.Second},
		{"only expired endpoints have none", []*apiv1.Endpoint{{Node: "a", LeaseExpires: at(-time.Second), LeaseSeconds: 2}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := ShortestLease(tt.eps, t0); got != tt.want {
				t.Fatalf("ShortestLease = %v, want %v", got, tt.want)
			}
		})
	}
}
