package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// helmBin is the helm command tests/helm/build.sh built from helm.sh/helm (cached, offline).
func helmBin(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(root, "tests", "helm", "build.sh")).Output()
	if err != nil {
		t.Fatalf("tests/helm/build.sh: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "helm")
}

// helm runs the helm command against cluster c's API server, the release in namespace default.
func (m *mesh) helm(helm, c string, args ...string) (string, error) {
	cmd := exec.Command(helm, append([]string{"--kubeconfig", filepath.Join(m.dir, c, "kubeconfig"), "--namespace", "default"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHelm: east is installed with the chart deploy/helm/cablemesh (`helm install`, by
// tests/k8s/helm-install.sh through k8s-demo.sh), west with cablectl; the agents of both come
// up Ready on every node and carry traffic across the cable; `helm upgrade` with a changed value
// rolls east's DaemonSets while a TCP stream crosses the cable, and the stream's longest stall is
// measured; `helm uninstall` removes the agents and leaves east's nodes clean.
func TestHelm(t *testing.T) {
	requireStage(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	helm := helmBin(t, root)
	t.Setenv("CABLEMESH_K8S_HELM", "east")
	m := upMesh(t)

	t.Run("helm install: the release is deployed and its agents Ready on every node", func(t *testing.T) {
		out, err := m.helm(helm, "east", "list", "-o", "json")
		if err != nil {
			t.Fatalf("helm list: %v\n%s", err, out)
		}
		var rels []struct {
			Name, Status, Chart string
		}
		if err := json.Unmarshal([]byte(out), &rels); err != nil || len(rels) != 1 || rels[0].Name != "cablemesh" || rels[0].Status != "deployed" {
			t.Fatalf("helm list: %s (%v), want the release cablemesh deployed", out, err)
		}
		t.Logf("release %s, chart %s, %s", rels[0].Name, rels[0].Chart, rels[0].Status)
		for _, ds := range []string{"cable-agent", "cable-agent-worker"} {
			got := m.mustKC("east", "", "-n", "cablemesh", "get", "ds", ds, "-o",
				`jsonpath={.metadata.labels.app\.kubernetes\.io/managed-by} {.status.numberReady}/{.status.desiredNumberScheduled}`)
			if got != "Helm 1/1" {
				t.Errorf("east's DaemonSet %s: managed-by and ready %q, want %q", ds, got, "Helm 1/1")
			}
		}
		// The CRDs came from the chart's crds/ directory.
		m.mustKC("east", "", "get", "crd", "clusterconnectionpolicies.cablemesh.io", "serviceexports.multicluster.x-k8s.io")
	})

	m.mustKC("west", westApps, "apply", "-f", "-")
	m.mustKC("east", eastApps, "apply", "-f", "-")
	m.mustKC("west", "", "-n", "demo", "wait", "--for", "condition=Available", "deploy/web", "--timeout", "120s")
	m.mustKC("east", "", "-n", "demo", "wait", "--for", "condition=Ready", "pod", "--all", "--timeout", "120s")
	webIP := strings.TrimSpace(m.mustKC("west", "", "-n", "demo", "get", "pod", "-l", "app=web", "-o", "jsonpath={.items[0].status.podIP}"))

	t.Run("east's worker pod reaches west's pod over the cable", func(t *testing.T) {
		var answer string
		d := waitFor(t, 90*time.Second, "client-worker -> "+webIP, func() (err error) {
			answer, _, err = m.call("east", "client-worker", webIP+":80")
			return err
		})
		if answer != "hello from west" {
			t.Errorf("client-worker -> %s answered %q, want %q", webIP, answer, "hello from west")
		}
		t.Logf("east's client-worker -> west's pod %s: %q (after %v)", webIP, answer, d.Round(time.Millisecond))
	})

	t.Run("helm upgrade with a changed value rolls the DaemonSets under a TCP stream across the cable", func(t *testing.T) {
		const streamFor = 60 * time.Second
		gens := func() string {
			return m.mustKC("east", "", "-n", "cablemesh", "get", "ds", "cable-agent", "cable-agent-worker", "-o", "jsonpath={.items[*].metadata.generation}")
		}
		before := gens()
		stream := m.startStream(t, streamFor, webIP+":81")
		start := time.Now()
		// A changed value every operator changes: the agent's resources (both DaemonSets' pods).
		args := append([]string{"upgrade", "cablemesh", filepath.Join(root, "deploy", "helm", "cablemesh"),
			"--reuse-values", "--set", "resources.requests.cpu=60m"}, postRenderer(t, m)...)
		if out, err := m.helm(helm, "east", args...); err != nil {
			t.Fatalf("helm upgrade: %v\n%s", err, out)
		}
		for _, ds := range []string{"cable-agent", "cable-agent-worker"} {
			m.mustKC("east", "", "-n", "cablemesh", "rollout", "status", "ds/"+ds, "--timeout", "180s")
		}
		rolled := time.Since(start)
		after := gens()
		if after == before {
			t.Errorf("the DaemonSets' generations %q did not change: nothing rolled", after)
		}
		cpu := m.mustKC("east", "", "-n", "cablemesh", "get", "pods", "-l", "app.kubernetes.io/name in (cable-agent,cable-agent-worker)",
			"-o", "jsonpath={.items[*].spec.containers[0].resources.requests.cpu}")
		if cpu != "60m 60m" {
			t.Errorf("the agent pods request cpu %q, want 60m on both nodes", cpu)
		}
		t.Logf("helm upgrade and the rollout of both DaemonSets done in %v (generations %s -> %s)", rolled.Round(time.Millisecond), before, after)
		if rolled > streamFor-10*time.Second {
			t.Errorf("the rollout took %v: the %v stream (started 5 s before it) did not cover it", rolled, streamFor)
		}
		rep := stream()
		t.Logf("stream over %v: %d counters received, longest stall %d ms, %d reconnects, errors %v", streamFor, rep.Received, rep.LongestStallMs, rep.Reconnects, rep.Errors)
		if rep.Reconnects != 0 || rep.Lost != 0 {
			t.Errorf("the stream broke during the upgrade: %d reconnects, %d counters lost (errors %v)", rep.Reconnects, rep.Lost, rep.Errors)
		}
		// The goal is 1 s. Where the kernel has no WireGuard (this host), the tunnel is
		// wireguard-go inside the gateway agent's process: it goes with the old pod and is back
		// when the new pod has the device up and handshaken (maxUnavailable 1, one gateway), as
		// in TestCrossCluster's rollout restart. So the stall is reported, and held to that
		// test's bound; docs/helm.md gives the figures.
		if rep.LongestStallMs > 1000 {
			t.Logf("FINDING: longest stall %d ms over the 1 s goal (the gateway's wireguard-go restarts with its pod)", rep.LongestStallMs)
		}
		const maxStall = 20000
		if rep.LongestStallMs > maxStall {
			t.Errorf("longest stall %d ms, want at most %d ms", rep.LongestStallMs, maxStall)
		}
	})

	t.Run("helm uninstall removes the agents and they clean east's nodes", func(t *testing.T) {
		if out, err := m.helm(helm, "east", "uninstall", "cablemesh", "--wait", "--timeout", "120s"); err != nil {
			t.Fatalf("helm uninstall: %v\n%s", err, out)
		}
		waitFor(t, 90*time.Second, "every agent pod and the namespace gone", func() error {
			out, err := m.kc("east", "", "get", "pods", "-A", "-l", "app.kubernetes.io/part-of=cablemesh", "-o", "name")
			if err != nil || strings.TrimSpace(out) != "" {
				return fmt.Errorf("pods left: %q %v", out, err)
			}
			if out := strings.TrimSpace(m.mustKC("east", "", "get", "namespace", "cablemesh", "--ignore-not-found", "-o", "name")); out != "" {
				return fmt.Errorf("namespace left: %s", out)
			}
			return nil
		})
		// Helm keeps the CRDs of crds/ (as cablectl uninstall does without --include-crds).
		m.mustKC("east", "", "get", "crd", "clusterconnectionpolicies.cablemesh.io")
		for _, node := range []string{"gw", "worker"} {
			if left := m.nodeLeftovers("east", node); len(left) > 0 {
				t.Errorf("east-%s after helm uninstall still holds: %s", node, strings.Join(left, "; "))
			}
		}
	})
}

// postRenderer is the nodeagents filter k8s-demo.sh runs the install through, as helm's
// post-renderer (helm-install.sh's): a release's post-renderer is not kept, every upgrade names it.
func postRenderer(t *testing.T, m *mesh) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(m.dir, "nodeagents.args"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"--post-renderer", filepath.Join(m.dir, "nodeagents")}
	for _, a := range strings.Fields(string(data)) {
		out = append(out, "--post-renderer-args="+a)
	}
	return out
}
