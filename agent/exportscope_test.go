package agent

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/exports"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The agent refuses a runtime export with an endpoint outside its cluster before sending it
// (the broker would refuse the node's whole set), naming the field, the value and the CIDRs, and
// changes nothing; a Kubernetes export loses such endpoints, not the service.
func TestAnEndpointOutsideTheClusterIsRefusedByTheAgent(t *testing.T) {
	b := newBroker(t)
	src := &fakeSource{ch: make(chan []*apiv1.ServiceExport)}
	_, cfg, _, _ := servicesAgent(t, b, &switchPinger{}, func(c *config.Config, o *Options) {
		c.Kubernetes.Enabled = true
		o.Kubernetes = src
	})
	eventually(t, "east's cluster record known", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Services != nil && s.Services.ImportsKnown
	})
	for _, ip := range []string{"127.0.0.1", "169.254.169.254", "10.2.0.10", "::1"} {
		lo := statusapi.Export{Ports: []statusapi.ServicePort{{Name: "http", Port: 8080, Protocol: "TCP"}},
			Endpoints: []statusapi.ServiceEndpoint{{IP: "10.1.0.10", Ready: true}, {IP: ip, Ready: true}, {IP: "10.1.0.1", Ready: true}}}
		code, body := agentAPI(t, cfg.StatusSocket, "PUT", statusapi.ExportsPath+"shop/lo", lo)
		want := "export.endpoints[1].ip " + ip + " is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs []"
		if code != http.StatusBadRequest || !strings.Contains(string(body), want) {
			t.Errorf("PUT lo at %s: %d %s; want 400 and %q", ip, code, body, want)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, exports.ExportsFile)); !os.IsNotExist(err) {
		t.Errorf("a refused export reached exports.json: %v", err)
	}

	src.ch <- []*apiv1.ServiceExport{{Namespace: "shop", Name: "cart", Ports: []*apiv1.ServicePort{{Port: 80}},
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.30", Ready: true}, {Ip: "192.0.2.7", Ready: true}}}}
	eventually(t, "the Kubernetes export at the broker without its endpoint outside east", func() bool {
		got, _ := b.Exports("east", "east-gw1")
		return len(got) == 1 && got[0].GetName() == "cart" && len(got[0].GetEndpoints()) == 1 && got[0].GetEndpoints()[0].GetIp() == "10.1.0.30"
	})
}
