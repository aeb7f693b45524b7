package k8s

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// demoCall runs make k8s-demo's `kubectl -n demo exec POD -- /call HOST:PORT` in cluster c: the
// name resolves through the pod's own resolv.conf (the kubelet's clusterDNS, CoreDNS). It
// returns the answer and the address connected to.
func (m *mesh) demoCall(c, pod, hostPort string) (answer, addr string, err error) {
	out, err := m.kc(c, "", "-n", "demo", "exec", pod, "--", "/call", hostPort)
	if err != nil {
		return "", "", fmt.Errorf("%v: %s", err, out)
	}
	answer, rest, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return answer, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), "via ")), nil
}

// clusterDNS runs tests/k8s/coredns/cluster-dns.sh for cluster c (index i) in mode.
func (m *mesh) clusterDNS(c string, i int, mode string) {
	m.t.Helper()
	cmd := exec.Command(filepath.Join(m.root, "tests", "k8s", "coredns", "cluster-dns.sh"), c, fmt.Sprint(i), mode)
	cmd.Env = append(os.Environ(), "CABLEMESH_K8S_DIR="+m.dir, "K8S_BIN="+filepath.Dir(m.kubectl))
	if out, err := cmd.CombinedOutput(); err != nil {
		m.t.Fatalf("cluster-dns.sh %s %d %s: %v\n%s", c, i, mode, err, out)
	}
}

// serviceImportVIP is the VIP of the ServiceImport demo/web the agents wrote in cluster c.
func (m *mesh) serviceImportVIP(c string) (string, error) {
	out, err := m.kc(c, "", "-n", "demo", "get", "serviceimports", "web", "-o", "jsonpath={.spec.ips[0]}")
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	if _, err := netip.ParseAddr(out); err != nil {
		return "", fmt.Errorf("ServiceImport demo/web VIP %q: %v", out, err)
	}
	return out, nil
}

// coreDNSLogged reports whether cluster c's CoreDNS logged a query for name (the log plugin on
// clusterset.local in both modes of cluster-dns.sh).
func (m *mesh) coreDNSLogged(c, name string) error {
	out, err := m.kc(c, "", "-n", "kube-system", "logs", "deployment/coredns")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	if !strings.Contains(out, `"A IN `+name+`. `) {
		return fmt.Errorf("CoreDNS of %s logged no A query for %s:\n%s", c, name, tail(out, 20))
	}
	return nil
}

// TestClusterDNS: make k8s-demo's clusters with their cluster DNS and demo workload. First
// CoreDNS forwarding clusterset.local to the agents (the Service cable-agent-dns and the
// Corefile stanza of docs/services.md): `kubectl -n demo exec client -- /call
// web.demo.svc.clusterset.local:80` answers from both nodes of both clusters, resolved through
// CoreDNS to the ServiceImport's VIP. Then east's CoreDNS switched to the kubernetes plugin's
// multicluster option (no forwarding, the agents' DNS Service gone): the same name answers the
// ServiceImport's VIP, now from the ServiceImports alone, and a name no cluster exports is
// NXDOMAIN.
func TestClusterDNS(t *testing.T) {
	requireStage(t)
	m := upMeshApps(t, true)
	clusters := []string{"east", "west"}
	answers := map[string]bool{"hello from east": true, "hello from west": true}

	t.Run("cluster.local through CoreDNS's kubernetes plugin", func(t *testing.T) {
		for _, c := range clusters {
			answer, _, err := m.demoCall(c, "client", "web.demo.svc.cluster.local:80")
			if err != nil || answer != "hello from "+c {
				t.Errorf("%s: client -> web.demo.svc.cluster.local: %q, %v; want %q", c, answer, err, "hello from "+c)
			}
		}
	})

	t.Run("clusterset.local forwarded by CoreDNS to the agents", func(t *testing.T) {
		for _, c := range clusters {
			var vip string
			waitFor(t, 90*time.Second, c+"'s ServiceImport demo/web", func() (err error) {
				vip, err = m.serviceImportVIP(c)
				return err
			})
			for _, pod := range []string{"client", "client-worker"} {
				var answer, addr string
				d := waitFor(t, 90*time.Second, c+"/"+pod+" -> "+exportName, func() (err error) {
					answer, addr, err = m.demoCall(c, pod, exportName+":80")
					return err
				})
				if !answers[answer] {
					t.Errorf("%s/%s -> %s answered %q, want hello from east or west", c, pod, exportName, answer)
				}
				if addr != vip {
					t.Errorf("%s/%s: %s resolved to %q, want the ServiceImport's VIP %s", c, pod, exportName, addr, vip)
				}
				t.Logf("%s/%s -> %s (VIP %s, through CoreDNS): %q (after %v)", c, pod, exportName, addr, answer, d.Round(time.Millisecond))
			}
			if err := m.coreDNSLogged(c, exportName); err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("clusterset.local from the ServiceImports by CoreDNS's multicluster option", func(t *testing.T) {
		start := time.Now()
		m.clusterDNS("east", 1, "multicluster")
		t.Logf("east's CoreDNS restarted in multicluster mode in %v", time.Since(start).Round(time.Millisecond))
		if out, _ := m.kc("east", "", "-n", "cablemesh", "get", "service", "cable-agent-dns", "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Fatalf("the agents' DNS Service is still there in multicluster mode: %s", out)
		}
		vip, err := m.serviceImportVIP("east")
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range []string{"client", "client-worker"} {
			var answer, addr string
			d := waitFor(t, 60*time.Second, "east/"+pod+" -> "+exportName, func() (err error) {
				answer, addr, err = m.demoCall("east", pod, exportName+":80")
				return err
			})
			if addr != vip || !answers[answer] {
				t.Errorf("east/%s -> %s: %q via %q; want hello from east or west via the ServiceImport's VIP %s", pod, exportName, answer, addr, vip)
			}
			t.Logf("east/%s -> %s (VIP %s, CoreDNS multicluster): %q (after %v)", pod, exportName, addr, answer, d.Round(time.Millisecond))
		}
		if err := m.coreDNSLogged("east", exportName); err != nil {
			t.Error(err)
		}
		const notExported = "nope.demo.svc.clusterset.local"
		if _, _, err := m.demoCall("east", "client", notExported+":80"); err == nil || !strings.Contains(err.Error(), "no such host") {
			t.Errorf("east/client -> %s: %v; want no such host (NXDOMAIN: no ServiceImport)", notExported, err)
		}
	})
}
