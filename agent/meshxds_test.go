package agent

import (
	"context"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	client "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/agent/xds"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// xdsListenerAddrs fetches the listeners over sock's ADS and returns each one's bound
// address ("ip:port"; "" for API listeners), by name.
func xdsListenerAddrs(t *testing.T, sock string) map[string]string {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: "unit-envoy-" + strconv.FormatInt(time.Now().UnixNano(), 36)}, resourcev3.ListenerType)
	if err := c.InitConnect(cc); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Fetch()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range resp.Resources {
		var l listener.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		sa := l.GetAddress().GetSocketAddress()
		if sa != nil {
			out[l.Name] = sa.GetAddress() + ":" + strconv.Itoa(int(sa.GetPortValue()))
		} else {
			out[l.Name] = ""
		}
	}
	return out
}

// xdsOf is the status's xDS section, nil when absent.
func xdsOf(st statusapi.Status) *statusapi.XDSStatus {
	if st.Ingress == nil {
		return nil
	}
	return st.Ingress.XDS
}

// TestEnvoyIngressListenersFollowTheMeshAddress: a gateway in gateway mode with ingress.mode
// envoy serves its ingress-port listeners on 0.0.0.0 (and says why in its status) until the
// broker gives it a mesh address; once cbl-mesh0 holds it, the snapshot is rebuilt and the
// listeners bind the mesh address; the nftables data plane is given the SNAT alone (no
// services: Envoy serves the ports).
func TestEnvoyIngressListenersFollowTheMeshAddress(t *testing.T) {
	b := newBroker(t)
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true})
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.MeshAddress = "242.0.0.2"
	b.UpsertEndpoint(west)
	cfg := testConfig(t, b, true)
	sock := filepath.Join(filepath.Dir(cfg.StatusSocket), "xds.sock")
	cfg.Ingress.Mode = config.IngressEnvoy
	cfg.Ingress.XDS.Listen = sock
	cfg.Exports = []config.Export{{Name: "web", Namespace: "shop", Ports: []config.ExportPort{{Name: "http", Port: 80, Protocol: "TCP"}},
		Endpoints: []config.ExportEndpoint{{IP: "10.1.0.10"}}}}
	d := fakedriver.New()
	f := &fakeIngress{}
	startAgentWith(t, cfg, d, func(o *Options) { fakeMeshIngress(o, f) })

	const port = "ingress-tcp-15000"
	eventually(t, "the agent registered", func() bool { return b.Endpoint("east", cfg.Node) != nil })
	eventually(t, "the ingress-port listener on the wildcard before any mesh address", func() bool {
		st, _ := getStatus(t, cfg.StatusSocket)
		x := xdsOf(st)
		return x != nil && x.IngressPortsBind == "0.0.0.0" && strings.Contains(x.IngressPortsBindNote, "no mesh address")
	})
	if got := xdsListenerAddrs(t, sock)[port]; got != "0.0.0.0:15000" {
		t.Fatalf("before the mesh address: %s binds %q, want 0.0.0.0:15000", port, got)
	}

	own := proto.Clone(b.Endpoint("east", cfg.Node)).(*apiv1.Endpoint)
	own.MeshAddress = "242.0.0.1"
	b.UpsertEndpoint(own)

	eventually(t, "the status names the mesh address as the ingress-port listeners' address", func() bool {
		st, _ := getStatus(t, cfg.StatusSocket)
		x := xdsOf(st)
		return x != nil && x.IngressPortsBind == "242.0.0.1" && x.IngressPortsBindNote == ""
	})
	addrs := xdsListenerAddrs(t, sock)
	if got := addrs[port]; got != "242.0.0.1:15000" {
		t.Errorf("with mesh address 242.0.0.1: %s binds %q, want 242.0.0.1:15000 (all: %v)", port, got, addrs)
	}
	// The shared listeners keep the wildcard: direct pairs' callers reach them at the node's
	// own addresses.
	if got := addrs[xds.SNIListener]; got != "0.0.0.0:16443" {
		t.Errorf("%s binds %q, want 0.0.0.0:16443", xds.SNIListener, got)
	}
	eventually(t, "the data plane SNATs to west's mesh address and serves no port itself", func() bool {
		c, ok := f.last()
		return ok && c.MeshAddress == netip.MustParseAddr("242.0.0.1") && len(c.RemoteMeshAddresses) == 1 && c.Services == nil
	})
}
