// Package k8s holds the Kubernetes stage: real clusters on this machine from upstream binaries
// (build.sh, cluster.sh). The tests need root and CABLEMESH_K8S=1 (a cold build of the binaries
// takes 15-30 minutes; K8S_BIN=DIR uses binaries built elsewhere):
//
//	cd tests/k8s && sudo CABLEMESH_K8S=1 go test -v -count=1 -timeout 60m .
package k8s

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cluster is one cluster brought up by cluster.sh for a test.
type cluster struct {
	t       *testing.T
	name    string
	index   int
	dir     string // CABLEMESH_K8S_DIR
	script  string
	kubectl string
}

func requireStage(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("the k8s stage needs root (network namespaces, mounts, cgroups)")
	}
	if os.Getenv("CABLEMESH_K8S") != "1" {
		t.Skip("set CABLEMESH_K8S=1 to run the k8s stage: it builds Kubernetes (15-30 minutes cold) and runs real clusters")
	}
}

// k8sBin builds or reuses the Kubernetes binaries once per test binary.
func k8sBin(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("K8S_BIN"); dir != "" {
		return dir
	}
	out, err := exec.Command("./build.sh").Output()
	if err != nil {
		t.Fatalf("build.sh: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	os.Setenv("K8S_BIN", dir)
	return dir
}

// stateDir is where a test's clusters keep their state: below $CABLEMESH_K8S_TEST_DIR when set
// (make k8s-test, whose scripts/k8s-test-cleanup.sh removes what a killed run left there), in
// DIR/<test>/<random>, else a temporary directory of the test's.
func stateDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("CABLEMESH_K8S_TEST_DIR")
	if root == "" {
		return t.TempDir()
	}
	parent := filepath.Join(root, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	if err := os.MkdirAll(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// freeIndex picks a cluster index whose bridge does not exist, so a test does not collide with
// `make k8s-demo` (1 and 2) or another run.
func freeIndex(t *testing.T) int {
	t.Helper()
	for i := 50; i < 100; i++ {
		if _, err := os.Stat("/sys/class/net/" + fmt.Sprintf("ck%dbr", i)); os.IsNotExist(err) {
			return i
		}
	}
	t.Fatal("no free cluster index in 50-99")
	return 0
}

func randomName(t *testing.T) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "t" + hex.EncodeToString(b)
}

// upCluster brings up a cluster with the given nodes; its removal is registered as a cleanup
// that also checks nothing of it is left.
func upCluster(t *testing.T, nodes ...string) *cluster {
	t.Helper()
	bin := k8sBin(t)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, name: randomName(t), index: freeIndex(t), dir: stateDir(t),
		script: filepath.Join(here, "cluster.sh"), kubectl: filepath.Join(bin, "kubectl")}
	t.Cleanup(func() { c.down() })
	start := time.Now()
	args := append([]string{"up", c.name, fmt.Sprint(c.index)}, nodes...)
	if out, err := c.run(args...); err != nil {
		t.Fatalf("cluster.sh up: %v\n%s\n%s", err, out, c.logTails())
	}
	t.Logf("cluster %s (index %d) up with nodes %v in %v", c.name, c.index, nodes, time.Since(start).Round(time.Second))
	return c
}

func (c *cluster) run(args ...string) (string, error) {
	cmd := exec.Command(c.script, args...)
	cmd.Env = append(os.Environ(), "CABLEMESH_K8S_DIR="+c.dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// logTails is the end of every log of the cluster, for a failure message.
func (c *cluster) logTails() string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(c.dir, c.name, "logs", "*.log"))
	nodeLogs, _ := filepath.Glob(filepath.Join(c.dir, c.name, "nodes", "*", "logs", "*.log"))
	for _, f := range append(logs, nodeLogs...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", f, strings.Join(lines, "\n"))
	}
	return b.String()
}

func (c *cluster) kubeconfig() string { return filepath.Join(c.dir, c.name, "kubeconfig") }

// kc runs kubectl against the cluster with stdin; it returns stdout+stderr.
func (c *cluster) kc(stdin string, args ...string) (string, error) {
	cmd := exec.Command(c.kubectl, append([]string{"--kubeconfig", c.kubeconfig()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) mustKC(stdin string, args ...string) string {
	c.t.Helper()
	out, err := c.kc(stdin, args...)
	if err != nil {
		c.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// down removes the cluster and checks that none of it is left on the machine.
func (c *cluster) down() {
	t := c.t
	if out, err := c.run("down", c.name); err != nil {
		t.Errorf("cluster.sh down: %v\n%s", err, out)
	}
	for _, left := range c.leftovers() {
		t.Errorf("left after down: %s", left)
	}
}

func (c *cluster) leftovers() []string {
	var left []string
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "ck8-"+c.name+"-") {
				left = append(left, "network namespace "+strings.Fields(line)[0])
			}
		}
	}
	if _, err := os.Stat(fmt.Sprintf("/sys/class/net/ck%dbr", c.index)); err == nil {
		left = append(left, fmt.Sprintf("bridge ck%dbr", c.index))
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/cablemesh-k8s/" + c.name + "-*")
	for _, cg := range cgroups {
		left = append(left, "cgroup "+cg)
	}
	if _, err := os.Stat(filepath.Join(c.dir, c.name)); err == nil {
		left = append(left, "state directory "+filepath.Join(c.dir, c.name))
	}
	// Every process of the cluster names its state directory (or runs from a node's).
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(string(data), "\x00", " ")
		if strings.Contains(cmdline, filepath.Join(c.dir, c.name)+"/") {
			left = append(left, "process "+filepath.Base(filepath.Dir(p))+": "+cmdline)
		}
	}
	return left
}

type nodeList struct {
	Items []struct {
		Metadata struct{ Name string } `json:"metadata"`
		Spec     struct {
			PodCIDR string `json:"podCIDR"`
		} `json:"spec"`
		Status struct {
			Conditions []struct{ Type, Status string } `json:"conditions"`
			NodeInfo   struct {
				KubeletVersion          string `json:"kubeletVersion"`
				ContainerRuntimeVersion string `json:"containerRuntimeVersion"`
			} `json:"nodeInfo"`
		} `json:"status"`
	} `json:"items"`
}

func TestCluster(t *testing.T) {
	requireStage(t)
	c := upCluster(t, "gw", "worker")
	podNet := netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", c.index))

	t.Run("the nodes are Ready with pod CIDRs of their own", func(t *testing.T) {
		var nodes nodeList
		if err := json.Unmarshal([]byte(c.mustKC("", "get", "nodes", "-o", "json")), &nodes); err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != 2 {
			t.Fatalf("%d nodes, want 2", len(nodes.Items))
		}
		seen := map[string]bool{}
		for _, n := range nodes.Items {
			ready := false
			for _, cond := range n.Status.Conditions {
				ready = ready || cond.Type == "Ready" && cond.Status == "True"
			}
			if !ready {
				t.Errorf("node %s is not Ready: %+v", n.Metadata.Name, n.Status.Conditions)
			}
			p, err := netip.ParsePrefix(n.Spec.PodCIDR)
			if err != nil || p.Bits() != 24 || !podNet.Contains(p.Addr()) || seen[n.Spec.PodCIDR] {
				t.Errorf("node %s pod CIDR %q: want a /24 of %s of its own", n.Metadata.Name, n.Spec.PodCIDR, podNet)
			}
			seen[n.Spec.PodCIDR] = true
			if n.Status.NodeInfo.KubeletVersion != "v1.37.2" {
				t.Errorf("node %s kubelet %q, want v1.37.2", n.Metadata.Name, n.Status.NodeInfo.KubeletVersion)
			}
		}
	})

	t.Run("the server version parses (the binaries carry their version)", func(t *testing.T) {
		var v struct {
			ServerVersion struct{ GitVersion string } `json:"serverVersion"`
		}
		if err := json.Unmarshal([]byte(c.mustKC("", "version", "-o", "json")), &v); err != nil {
			t.Fatal(err)
		}
		if v.ServerVersion.GitVersion != "v1.37.2" {
			t.Errorf("server version %q, want v1.37.2", v.ServerVersion.GitVersion)
		}
	})

	t.Run("the API server enforces the policy CRD's schema and CEL rules", func(t *testing.T) {
		c.mustKC("", "apply", "-f", "../../deploy/crds/cablemesh.io_clusterconnectionpolicies.yaml")
		c.mustKC("", "wait", "--for", "condition=Established", "--timeout", "60s", "crd/clusterconnectionpolicies.cablemesh.io")
		policy := func(name, spec string) string {
			return "apiVersion: cablemesh.io/v1alpha1\nkind: ClusterConnectionPolicy\nmetadata: {name: " + name +
				", labels: {cablemesh.io/origin: cluster}}\nspec:\n" + spec
		}
		good := policy("good", "  connectionPolicy: connect\n  topology: full-mesh\n  clusterSelector: {env: prod}\n  cableDriver: {name: vxlan}\n")
		if out, err := c.kc(good, "apply", "-f", "-"); err != nil {
			t.Fatalf("a valid policy is refused: %v\n%s", err, out)
		}
		bad := []struct{ name, spec, want string }{
			{"mixed", "  clusterSelector: {env: prod}\n  leftClusterSelector: {env: dev}\n", "clusterSelector cannot be combined with leftClusterSelector or rightClusterSelector"},
			{"no-connect-driver", "  connectionPolicy: no-connect\n  clusterSelector: {env: prod}\n  cableDriver: {name: vxlan}\n", "a no-connect policy takes no cableDriver"},
			{"star", "  topology: star\n  clusterSelector: {env: prod}\n", "spec.topology"},
			{"gre", "  clusterSelector: {env: prod}\n  cableDriver: {name: gre}\n", "spec.cableDriver.name"},
		}
		for _, b := range bad {
			out, err := c.kc(policy(b.name, b.spec), "apply", "-f", "-")
			if err == nil {
				t.Errorf("policy %s accepted by the server:\n%s", b.name, out)
			} else if !strings.Contains(out, b.want) {
				t.Errorf("policy %s refused, but not for %q:\n%s", b.name, b.want, out)
			}
		}
		c.mustKC("", "delete", "-f", "../../deploy/crds/cablemesh.io_clusterconnectionpolicies.yaml")
	})

	t.Run("the real authorizer grants the agent exactly the README's RBAC", func(t *testing.T) {
		c.mustKC("", "apply", "-k", "../../deploy/daemonset")
		defer c.mustKC("", "delete", "--wait=true", "-k", "../../deploy/daemonset")
		const sa = "--as=system:serviceaccount:cablemesh:cable-agent"
		allowed := [][]string{
			{"get", "nodes"}, {"list", "nodes"}, {"watch", "nodes"},
			{"get", "services", "-A"}, {"list", "services", "-A"}, {"watch", "services", "-A"},
			{"list", "endpointslices.discovery.k8s.io", "-A"}, {"watch", "endpointslices.discovery.k8s.io", "-A"},
			{"list", "serviceexports.multicluster.x-k8s.io", "-A"}, {"watch", "serviceimports.multicluster.x-k8s.io", "-A"},
			{"update", "serviceexports.multicluster.x-k8s.io", "--subresource=status", "-n", "demo"},
			{"list", "clusterconnectionpolicies.cablemesh.io"}, {"watch", "clusterconnectionpolicies.cablemesh.io"},
			{"get", "daemonsets.apps/cable-agent", "-n", "cablemesh"}, {"watch", "daemonsets.apps/cable-agent-worker", "-n", "cablemesh"},
			{"get", "namespaces/cablemesh"}, {"watch", "namespaces/cablemesh"},
			// The service-imports writer (16-rbac-serviceimports.yaml).
			{"create", "serviceimports.multicluster.x-k8s.io", "-n", "demo"}, {"delete", "serviceimports.multicluster.x-k8s.io", "-n", "demo"},
			{"update", "serviceimports.multicluster.x-k8s.io", "--subresource=status", "-n", "demo"},
			{"create", "endpointslices.discovery.k8s.io", "-n", "demo"}, {"delete", "endpointslices.discovery.k8s.io", "-n", "demo"},
			{"update", "leases.coordination.k8s.io/cablemesh-service-imports", "-n", "cablemesh"}, {"create", "leases.coordination.k8s.io", "-n", "cablemesh"},
			// The status writer (17-rbac-kubestatus.yaml).
			{"list", "clusterlinks.cablemesh.io"}, {"create", "clusterlinks.cablemesh.io"}, {"update", "clusterlinks.cablemesh.io"},
			{"delete", "clusterlinks.cablemesh.io"}, {"update", "clusterconnectionpolicies.cablemesh.io", "--subresource=status"},
		}
		refused := [][]string{
			{"get", "secrets", "-n", "cablemesh"}, {"list", "pods", "-A"}, {"get", "configmaps", "-n", "cablemesh"},
			{"update", "nodes"}, {"patch", "nodes"}, {"create", "services", "-n", "demo"},
			{"update", "serviceexports.multicluster.x-k8s.io", "-n", "demo"},
			{"update", "leases.coordination.k8s.io/kube-controller-manager", "-n", "cablemesh"}, {"create", "leases.coordination.k8s.io", "-n", "kube-system"},
			{"patch", "serviceimports.multicluster.x-k8s.io", "-n", "demo"},
			{"create", "clusterconnectionpolicies.cablemesh.io"}, {"delete", "clusterconnectionpolicies.cablemesh.io"},
			{"update", "clusterconnectionpolicies.cablemesh.io"}, {"patch", "clusterlinks.cablemesh.io"}, {"watch", "clusterlinks.cablemesh.io"},
			{"list", "daemonsets.apps", "-n", "cablemesh"}, {"get", "daemonsets.apps/kube-proxy", "-n", "cablemesh"},
			{"get", "daemonsets.apps/cable-agent", "-n", "kube-system"}, {"delete", "daemonsets.apps/cable-agent", "-n", "cablemesh"},
			{"get", "namespaces/kube-system"}, {"delete", "namespaces/cablemesh"},
		}
		check := func(args []string, want string) {
			// The answer is the last line; kubectl warns first about a cluster-scoped resource.
			out, _ := c.kc("", append([]string{"auth", "can-i", sa}, args...)...)
			got := ""
			if lines := strings.Fields(out); len(lines) > 0 {
				got = lines[len(lines)-1]
			}
			if got != want {
				t.Errorf("can-i %s: %q, want %q", strings.Join(args, " "), got, want)
			}
		}
		for _, a := range allowed {
			check(a, "yes")
		}
		for _, a := range refused {
			check(a, "no")
		}
	})

	t.Run("a pod runs on the worker and is reached from the gateway node", func(t *testing.T) {
		pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\nspec:\n  nodeName: " + c.name +
			"-worker\n  containers: [{name: p, image: docker.io/cablemesh/pause:3.10, imagePullPolicy: Never}]\n"
		c.mustKC(pod, "apply", "-f", "-")
		c.mustKC("", "wait", "--for", "condition=Ready", "--timeout", "90s", "pod/p")
		ip := strings.TrimSpace(c.mustKC("", "get", "pod", "p", "-o", "jsonpath={.status.podIP}"))
		workerCIDR := strings.TrimSpace(c.mustKC("", "get", "node", c.name+"-worker", "-o", "jsonpath={.spec.podCIDR}"))
		addr, err := netip.ParseAddr(ip)
		if err != nil || !netip.MustParsePrefix(workerCIDR).Contains(addr) {
			t.Fatalf("pod IP %q is not in the worker's pod CIDR %s", ip, workerCIDR)
		}
		out, err := exec.Command("ip", "netns", "exec", "ck8-"+c.name+"-gw", "ping", "-n", "-c", "2", "-W", "2", ip).CombinedOutput()
		if err != nil {
			t.Errorf("ping from the gateway node to the worker's pod %s: %v\n%s", ip, err, out)
		}
		c.mustKC("", "delete", "pod", "p", "--wait=true", "--timeout=60s")
	})
}
