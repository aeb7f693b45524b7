// Command coredns is upstream CoreDNS (github.com/coredns/coredns) with only the plugins the
// Kubernetes harness and `make bench-dns` use compiled in. Upstream's own main imports
// core/plugin, which links every plugin of plugin.cfg (the Route 53, Azure and Cloud DNS
// backends with their cloud SDKs among them); importing a subset is CoreDNS's documented way
// to build a smaller server, and it keeps the cold build short. The server, the Corefile
// syntax and the plugins' code are upstream's, unchanged.
//
// The multicluster zone (clusterset.local from the MCS API's ServiceImports) is the
// kubernetes plugin's own `multicluster` option, in CoreDNS v1.15.0's tree. The separate
// github.com/coredns/multicluster plugin module is not served by the Go module proxy, so it
// is not used.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins a Corefile of this build may use. The order in which they run is
	// dnsserver.Directives (upstream's plugin.cfg order), not this list.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/root"
)

func main() {
	coremain.Run()
}
