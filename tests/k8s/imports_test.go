package k8s

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestServiceImports: a ServiceExport in west makes east's elected gateway write a ServiceImport
// with the clusterset VIP and an EndpointSlice of west's endpoints, labelled with the source
// cluster; deleting the ServiceExport removes both.
func TestServiceImports(t *testing.T) {
	requireStage(t)
	m := upMesh(t)
	m.mustKC("west", westApps, "apply", "-f", "-")
	m.mustKC("east", eastApps, "apply", "-f", "-")
	m.mustKC("west", "", "-n", "demo", "wait", "--for", "condition=Available", "deploy/web", "--timeout", "120s")
	webIP := strings.TrimSpace(m.mustKC("west", "", "-n", "demo", "get", "pod", "-l", "app=web", "-o", "jsonpath={.items[0].status.podIP}"))

	var vip string
	d := waitFor(t, 90*time.Second, "east's ServiceImport demo/web with a VIP", func() error {
		out, err := m.kc("east", "", "-n", "demo", "get", "serviceimports", "web", "-o", "jsonpath={.spec.type} {.spec.ips[0]} {.status.clusters[*].cluster}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		f := strings.Fields(out)
		if len(f) != 3 || f[0] != "ClusterSetIP" || f[2] != "west" {
			return fmt.Errorf("type, VIP, clusters: %q", out)
		}
		if _, err := netip.ParseAddr(f[1]); err != nil {
			return fmt.Errorf("VIP %q: %v", f[1], err)
		}
		vip = f[1]
		return nil
	})
	t.Logf("east's ServiceImport demo/web: VIP %s (after %v)", vip, d.Round(time.Millisecond))
	// kubectl get serviceimports shows the VIP (the CRD's IP column).
	if out := m.mustKC("east", "", "get", "serviceimports", "-A"); !strings.Contains(out, vip) {
		t.Errorf("kubectl get serviceimports -A lacks the VIP %s:\n%s", vip, out)
	}
	waitFor(t, 60*time.Second, "east's EndpointSlice of west's web", func() error {
		out, err := m.kc("east", "", "-n", "demo", "get", "endpointslices",
			"-l", "multicluster.kubernetes.io/service-name=web,multicluster.kubernetes.io/source-cluster=west,endpointslice.kubernetes.io/managed-by=cablemesh.io",
			"-o", "jsonpath={.items[*].endpoints[*].addresses[0]}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if !strings.Contains(out, webIP) {
			return fmt.Errorf("endpoints %q, want west's pod %s", out, webIP)
		}
		return nil
	})
	// The Lease names one gateway of east.
	holder := m.mustKC("east", "", "-n", "cablemesh", "get", "lease", "cablemesh-service-imports", "-o", "jsonpath={.spec.holderIdentity}")
	t.Logf("east's service-imports writer: %q", holder)

	m.mustKC("west", "", "-n", "demo", "delete", "serviceexport", "web")
	waitFor(t, 90*time.Second, "east's ServiceImport and EndpointSlice gone", func() error {
		out, _ := m.kc("east", "", "-n", "demo", "get", "serviceimports,endpointslices", "-l", "endpointslice.kubernetes.io/managed-by=cablemesh.io", "-o", "name")
		if strings.TrimSpace(out) != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}
