package k8s

import (
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

// mesh is the two clusters of scripts/k8s-demo.sh (east and west, a gateway and a worker node
// each, the broker, the agents installed with `cablectl install kubernetes | kubectl apply -f -`
// plus the worker agents of cmd/nodeagents), in a state directory of the test's own.
type mesh struct {
	t       *testing.T
	root    string // the repository
	dir     string // CABLEMESH_K8S_DIR
	bin     string // the project's binaries
	kubectl string
	// demoApps keeps k8s-demo.sh's own demo workload (namespace demo); the tests that apply
	// their own turn it off.
	demoApps bool
}

// The demo's fixed names: a second demo on the machine would collide with them.
const underlayBridge = "ck8ul"

func upMesh(t *testing.T) *mesh {
	t.Helper()
	return upMeshApps(t, false)
}

// upMeshApps is upMesh with, when demoApps, make k8s-demo's own workload in namespace demo.
func upMeshApps(t *testing.T, demoApps bool) *mesh {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("CABLEMESH_BIN")
	if bin == "" {
		bin = filepath.Join(root, "bin")
	}
	for _, b := range []string{"cable-broker", "cable-agent", "cablectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("%s: %v (run make build, or set CABLEMESH_BIN)", filepath.Join(bin, b), err)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + underlayBridge); err == nil {
		t.Fatalf("bridge %s exists: make k8s-demo is running on this machine (make k8s-demo-down first)", underlayBridge)
	}
	m := &mesh{t: t, root: root, dir: stateDir(t), bin: bin, kubectl: filepath.Join(k8sBin(t), "kubectl"), demoApps: demoApps}
	t.Cleanup(m.down)
	start := time.Now()
	if out, err := m.script("k8s-demo.sh"); err != nil {
		t.Fatalf("k8s-demo.sh: %v\n%s", err, tail(out, 60))
	}
	t.Logf("east and west up, agents Ready on every node, in %v", time.Since(start).Round(time.Second))
	for _, c := range []string{"east", "west"} {
		cmd := exec.Command(filepath.Join(root, "tests", "k8s", "cluster.sh"), "rss", c)
		cmd.Env = append(os.Environ(), "CABLEMESH_K8S_DIR="+m.dir)
		out, _ := cmd.CombinedOutput()
		t.Logf("resident memory of %s:\n%s", c, out)
	}
	return m
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (m *mesh) script(name string) (string, error) {
	cmd := exec.Command(filepath.Join(m.root, "scripts", name))
	apps := "0"
	if m.demoApps {
		apps = "1"
	}
	cmd.Env = append(os.Environ(), "CABLEMESH_K8S_DIR="+m.dir, "CABLEMESH_BIN="+m.bin, "CABLEMESH_K8S_DEMO_APPS="+apps)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (m *mesh) down() {
	t := m.t
	if out, err := m.script("k8s-demo-down.sh"); err != nil {
		t.Errorf("k8s-demo-down.sh: %v\n%s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "ck8-east-") || strings.HasPrefix(line, "ck8-west-") || strings.HasPrefix(line, "ck8-broker") {
				t.Errorf("left after down: network namespace %s", strings.Fields(line)[0])
			}
		}
	}
	for _, link := range []string{underlayBridge, "ck1br", "ck2br"} {
		if _, err := os.Stat("/sys/class/net/" + link); err == nil {
			t.Errorf("left after down: link %s", link)
		}
	}
	for _, c := range []string{"east", "west"} {
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/cablemesh-k8s/" + c + "-*")
		for _, cg := range cgroups {
			t.Errorf("left after down: cgroup %s", cg)
		}
	}
}

// kc runs kubectl against cluster c; it returns stdout and stderr together.
func (m *mesh) kc(c, stdin string, args ...string) (string, error) {
	cmd := exec.Command(m.kubectl, append([]string{"--kubeconfig", filepath.Join(m.dir, c, "kubeconfig")}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (m *mesh) mustKC(c, stdin string, args ...string) string {
	m.t.Helper()
	out, err := m.kc(c, stdin, args...)
	if err != nil {
		m.t.Fatalf("kubectl (%s) %s: %v\n%s", c, strings.Join(args, " "), err, out)
	}
	return out
}

// call runs `probe call` in a pod of east and returns its first line (the server's answer) and
// the address it connected to.
func (m *mesh) call(c, pod string, args ...string) (answer, addr string, err error) {
	out, err := m.kc(c, "", append([]string{"-n", "demo", "exec", pod, "--", "/probe", "call"}, args...)...)
	if err != nil {
		return "", "", fmt.Errorf("%v: %s", err, out)
	}
	answer, rest, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return answer, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), "via ")), nil
}

// status is the part of `cablectl status -o json` the test reads.
type agentStatus struct {
	Config struct {
		Revision int    `json:"revision"`
		Hash     string `json:"hash"`
		Refused  any    `json:"refused"`
	} `json:"config"`
	Drivers     []driverState     `json:"drivers"`
	Connections []connectionState `json:"connections"`
}

type driverState struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

// connectionState is a gateway's row for its connection to one remote cluster.
type connectionState struct {
	Cluster string `json:"cluster"`
	Driver  string `json:"driver"`
	State   string `json:"state"`
	Message string `json:"message"`
	RxBytes uint64 `json:"rxBytes"`
	TxBytes uint64 `json:"txBytes"`
	RTT     *struct {
		P50Ms float64 `json:"p50Ms"`
	} `json:"rtt"`
	Health *struct {
		Samples int `json:"samples"`
	} `json:"health"`
}

// nodeLeftovers lists what Cablemesh left on node of cluster c: cbl-* links, routes to the other
// cluster's pod and service CIDRs (the only cluster besides c), eBPF pins under
// /sys/fs/bpf/cablemesh (in the node's own bpffs) and files in its /var/lib/cablemesh.
func (m *mesh) nodeLeftovers(c, node string) []string {
	var left []string
	ns := "ck8-" + c + "-" + node
	links, err := exec.Command("ip", "-n", ns, "-o", "link", "show").Output()
	if err != nil {
		return []string{fmt.Sprintf("ip -n %s link: %v", ns, err)}
	}
	for _, l := range strings.Split(string(links), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "cbl-") {
			left = append(left, "link "+strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	other, otherSvc := "10.2.0.0/16", "10.96.2.0/24"
	if c == "west" {
		other, otherSvc = "10.1.0.0/16", "10.96.1.0/24"
	}
	for _, dst := range []string{other, otherSvc} {
		out, err := exec.Command("ip", "-n", ns, "route", "show", "table", "all", "match", dst).Output()
		if err != nil {
			left = append(left, fmt.Sprintf("ip route match %s: %v", dst, err))
		}
		for _, r := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// A route covering the other cluster's range from outside (the node's own default or
			// bridge routes) is not Cablemesh's: only one for a prefix inside it counts.
			if f := strings.Fields(r); len(f) > 0 && f[0] != "default" && f[0] != "local" && f[0] != "broadcast" {
				if p, err := netip.ParsePrefix(f[0]); err == nil && netip.MustParsePrefix(dst).Contains(p.Addr()) {
					left = append(left, "route "+r)
				} else if a, err := netip.ParseAddr(f[0]); err == nil && netip.MustParsePrefix(dst).Contains(a) {
					left = append(left, "route "+r)
				}
			}
		}
	}
	find := exec.Command(filepath.Join(m.root, "tests", "k8s", "cluster.sh"), "nodeexec", c, node,
		"find", "/sys/fs/bpf", "-path", "*cablemesh*")
	find.Env = append(os.Environ(), "CABLEMESH_K8S_DIR="+m.dir)
	pins, err := find.CombinedOutput()
	if err != nil {
		left = append(left, fmt.Sprintf("find /sys/fs/bpf on the node: %v: %s", err, pins))
	} else if p := strings.TrimSpace(string(pins)); p != "" {
		left = append(left, "pins "+strings.ReplaceAll(p, "\n", " "))
	}
	state, _ := filepath.Glob(filepath.Join(m.dir, c, "nodes", node, "var-lib", "cablemesh", "*"))
	if len(state) > 0 {
		left = append(left, fmt.Sprintf("state %v", state))
	}
	return left
}

func (m *mesh) agentStatus(c, node string) (agentStatus, error) {
	var st agentStatus
	sock := filepath.Join(m.dir, c, "nodes", node, "run", "cablemesh", "agent.sock")
	out, err := exec.Command(filepath.Join(m.bin, "cablectl"), "status", "--socket", sock, "-o", "json").Output()
	if err != nil {
		return st, fmt.Errorf("cablectl status --socket %s: %w", sock, err)
	}
	return st, json.Unmarshal(out, &st)
}

const westApps = `apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {cablemesh.io/gateway: "false"}
      containers:
      - name: web
        image: docker.io/cablemesh/k8s-probe:test
        imagePullPolicy: Never
        args: [serve, -text, hello from west]
        readinessProbe: {tcpSocket: {port: 80}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, protocol: TCP}, {name: stream, port: 81, protocol: TCP}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: web, namespace: demo}
`

const eastApps = `apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: client-worker, namespace: demo}
spec:
  nodeSelector: {cablemesh.io/gateway: "false"}
  containers:
  - {name: c, image: docker.io/cablemesh/k8s-probe:test, imagePullPolicy: Never, args: [serve, -text, hello from east worker]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-gw, namespace: demo}
spec:
  nodeSelector: {cablemesh.io/gateway: "true"}
  containers:
  - {name: c, image: docker.io/cablemesh/k8s-probe:test, imagePullPolicy: Never, args: [serve, -text, hello from east gw]}
`

// The DNS servers of east's agents (dns.listen on port 53, set by k8s-demo.sh through
// nodeagents): the gateway's and the worker's, each on its node.
var eastDNS = map[string]string{"client-gw": "172.29.1.11:53", "client-worker": "172.29.1.12:53"}

const exportName = "web.demo.svc.clusterset.local"

// waitFor retries f every half second until it returns nil or the time is up.
func waitFor(t *testing.T, d time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < d {
		if err = f(); err == nil {
			return time.Since(start)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s: not after %v: %v", what, d, err)
	return 0
}

func TestCrossCluster(t *testing.T) {
	requireStage(t)
	m := upMesh(t)

	m.mustKC("west", westApps, "apply", "-f", "-")
	m.mustKC("east", eastApps, "apply", "-f", "-")
	m.mustKC("west", "", "-n", "demo", "wait", "--for", "condition=Available", "deploy/web", "--timeout", "120s")
	m.mustKC("east", "", "-n", "demo", "wait", "--for", "condition=Ready", "pod", "--all", "--timeout", "120s")
	webIP := strings.TrimSpace(m.mustKC("west", "", "-n", "demo", "get", "pod", "-l", "app=web", "-o", "jsonpath={.items[0].status.podIP}"))
	if a, err := netip.ParseAddr(webIP); err != nil || !netip.MustParsePrefix("10.2.0.0/16").Contains(a) {
		t.Fatalf("west's web pod IP %q is not in west's pod CIDR 10.2.0.0/16", webIP)
	}

	t.Run("a pod of east reaches a pod of west over the cable, from the gateway and the worker", func(t *testing.T) {
		for _, pod := range []string{"client-gw", "client-worker"} {
			var answer string
			d := waitFor(t, 60*time.Second, pod+" -> "+webIP, func() (err error) {
				answer, _, err = m.call("east", pod, webIP+":80")
				return err
			})
			if answer != "hello from west" {
				t.Errorf("%s -> %s answered %q, want %q", pod, webIP, answer, "hello from west")
			}
			t.Logf("%s -> west's pod %s: %q (after %v)", pod, webIP, answer, d.Round(time.Millisecond))
		}
		// And back: west's worker pod to east's worker pod (the worker routes on both sides).
		eastIP := strings.TrimSpace(m.mustKC("east", "", "-n", "demo", "get", "pod", "client-worker", "-o", "jsonpath={.status.podIP}"))
		webPod := strings.TrimSpace(m.mustKC("west", "", "-n", "demo", "get", "pod", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"))
		answer, _, err := m.call("west", webPod, eastIP+":80")
		if err != nil || answer != "hello from east worker" {
			t.Errorf("west's %s -> east's worker pod %s: %q, %v; want %q", webPod, eastIP, answer, err, "hello from east worker")
		}
	})

	t.Run("west's ServiceExport answers east's pods by its clusterset.local name and VIP", func(t *testing.T) {
		for _, pod := range []string{"client-gw", "client-worker"} {
			var answer, vip string
			d := waitFor(t, 90*time.Second, pod+" -> "+exportName, func() (err error) {
				answer, vip, err = m.call("east", pod, "-dns", eastDNS[pod], exportName+":80")
				return err
			})
			if answer != "hello from west" {
				t.Errorf("%s -> %s answered %q, want %q", pod, exportName, answer, "hello from west")
			}
			// The name resolves to the import's VIP, which east's socket load balancer (in the
			// pod's node cgroup2) translates to west's pod: not the pod IP itself.
			if a, err := netip.ParseAddr(vip); err != nil || netip.MustParsePrefix("10.2.0.0/16").Contains(a) {
				t.Errorf("%s resolved to %q, want a VIP outside west's pod CIDR", exportName, vip)
			}
			t.Logf("%s -> %s (VIP %s, DNS %s): %q (after %v)", pod, exportName, vip, eastDNS[pod], answer, d.Round(time.Millisecond))
		}
	})

	t.Run("editing the agent ConfigMap with kubectl is applied live", func(t *testing.T) {
		before, err := m.agentStatus("east", "gw")
		if err != nil {
			t.Fatal(err)
		}
		podBefore := m.mustKC("east", "", "-n", "cablemesh", "get", "pod", "-l", "app.kubernetes.io/name=cable-agent",
			"-o", "jsonpath={.items[0].metadata.uid} {.items[0].status.containerStatuses[0].restartCount}")
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal([]byte(m.mustKC("east", "", "-n", "cablemesh", "get", "configmap", "cable-agent-config", "-o", "json")), &cm); err != nil {
			t.Fatal(err)
		}
		cfg := cm.Data["agent.yaml"]
		if strings.Contains(cfg, "healthCheck") {
			t.Fatalf("the rendered config already sets healthCheck:\n%s", cfg)
		}
		// healthCheck.period is a live field: the probers restart with it, nothing else does.
		patch, _ := json.Marshal(map[string]any{"data": map[string]string{"agent.yaml": cfg + "healthCheck: {period: 400ms}\n"}})
		m.mustKC("east", "", "-n", "cablemesh", "patch", "configmap", "cable-agent-config", "--type", "merge", "-p", string(patch))
		var after agentStatus
		d := waitFor(t, 120*time.Second, "the edited ConfigMap in force on east-gw", func() error {
			after, err = m.agentStatus("east", "gw")
			if err != nil {
				return err
			}
			if after.Config.Revision <= before.Config.Revision {
				return fmt.Errorf("config revision %d, was %d", after.Config.Revision, before.Config.Revision)
			}
			return nil
		})
		if after.Config.Hash == before.Config.Hash {
			t.Errorf("config hash unchanged (%s) at revision %d", after.Config.Hash, after.Config.Revision)
		}
		if after.Config.Refused != nil {
			t.Errorf("the agent refused the edit: %v", after.Config.Refused)
		}
		podAfter := m.mustKC("east", "", "-n", "cablemesh", "get", "pod", "-l", "app.kubernetes.io/name=cable-agent",
			"-o", "jsonpath={.items[0].metadata.uid} {.items[0].status.containerStatuses[0].restartCount}")
		if podAfter != podBefore {
			t.Errorf("the agent pod changed (uid, restarts): before %q, after %q: the edit was not applied live", podBefore, podAfter)
		}
		t.Logf("revision %d -> %d, applied %v after the patch, pod not restarted (%s)", before.Config.Revision, after.Config.Revision, d.Round(time.Millisecond), podAfter)
	})

	t.Run("a rollout restart of the DaemonSets under a TCP stream across the cable", func(t *testing.T) {
		// The stream goes through the VIP (socket load balancer at connect) to west's pod, from
		// east's worker pod: both the gateways' agents and the workers' agents are restarted.
		const streamFor = 60 * time.Second
		stream := m.startStream(t, streamFor, webIP+":81")
		start := time.Now()
		for _, c := range []string{"east", "west"} {
			m.mustKC(c, "", "-n", "cablemesh", "rollout", "restart", "ds/cable-agent", "ds/cable-agent-worker")
		}
		for _, c := range []string{"east", "west"} {
			for _, ds := range []string{"cable-agent", "cable-agent-worker"} {
				m.mustKC(c, "", "-n", "cablemesh", "rollout", "status", "ds/"+ds, "--timeout", "180s")
			}
		}
		rolled := time.Since(start)
		t.Logf("rollout restart of both clusters' agents done in %v", rolled.Round(time.Millisecond))
		if rolled > streamFor-10*time.Second {
			t.Errorf("the rollout took %v: the %v stream (started 5 s before it) did not cover it", rolled, streamFor)
		}
		rep := stream()
		t.Logf("stream over %v: %d counters received, longest stall %d ms, %d reconnects, errors %v", streamFor, rep.Received, rep.LongestStallMs, rep.Reconnects, rep.Errors)
		// Routes, eBPF pins and the state dir outlive the pod; where the kernel has no WireGuard
		// (this one) the tunnel is wireguard-go in the agent's process. The DaemonSets roll with
		// maxSurge: each new pod starts beside the old one and takes the node over from it
		// (agent/handover), so packets across the cable stop only for the old agent's stop and
		// the new one's device and handshake, not for the pod's replacement (1.7-3.3 s before).
		// Both clusters roll at once, so the stream crosses two hand-overs, one per end, and TCP's
		// retransmission backoff (0.2 s, doubling) runs across both: 266 and 1,089 ms measured.
		// The 1 s goal of one cluster's roll is TestHelm's. TCP retransmits through that:
		// nothing may be lost or reordered, no reconnect.
		if rep.Reconnects != 0 || rep.Lost != 0 {
			t.Errorf("the stream broke during the rollout: %d reconnects, %d counters lost (errors %v)", rep.Reconnects, rep.Lost, rep.Errors)
		}
		const maxStall = 2500
		if rep.LongestStallMs > maxStall {
			t.Errorf("longest stall %d ms, want at most %d ms", rep.LongestStallMs, maxStall)
		}
		if min := uint64(streamFor / (20 * time.Millisecond)); rep.Received < min {
			t.Errorf("%d counters in %v, want at least %d (one per 10 ms, half of them)", rep.Received, streamFor, min)
		}
	})

	t.Run("uninstall removes every object it installed", func(t *testing.T) {
		admin := filepath.Join(m.dir, "broker", "admin.yaml")
		args, err := os.ReadFile(filepath.Join(m.dir, "nodeagents.args"))
		if err != nil {
			t.Fatal(err)
		}
		pipe := fmt.Sprintf("%s --config %s uninstall kubernetes --cluster east | %s %s | %s --kubeconfig %s delete --wait=true -f -",
			filepath.Join(m.bin, "cablectl"), admin, filepath.Join(m.dir, "nodeagents"), strings.TrimSpace(string(args)),
			m.kubectl, filepath.Join(m.dir, "east", "kubeconfig"))
		out, err := exec.Command("bash", "-o", "pipefail", "-c", pipe).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", pipe, err, out)
		}
		waitFor(t, 90*time.Second, "every agent pod gone", func() error {
			out, err := m.kc("east", "", "get", "pods", "-A", "-l", "app.kubernetes.io/part-of=cablemesh", "-o", "name")
			if err != nil || strings.TrimSpace(out) != "" {
				return fmt.Errorf("pods left: %q %v", out, err)
			}
			return nil
		})
		for _, q := range [][]string{
			{"get", "namespace", "cablemesh", "--ignore-not-found", "-o", "name"},
			{"get", "clusterrole,clusterrolebinding", "-l", "app.kubernetes.io/part-of=cablemesh", "-o", "name"},
		} {
			if out := strings.TrimSpace(m.mustKC("east", "", q...)); out != "" {
				t.Errorf("kubectl %s: left after uninstall:\n%s", strings.Join(q, " "), out)
			}
		}
		// Each agent saw its DaemonSet deleted and, as it stopped, removed what it made on its
		// node: nothing of Cablemesh is left there.
		for _, node := range []string{"gw", "worker"} {
			left := m.nodeLeftovers("east", node)
			if len(left) > 0 {
				t.Errorf("east-%s after uninstall still holds: %s", node, strings.Join(left, "; "))
			} else {
				t.Logf("east-%s after uninstall: no cbl-* link, no route to west (10.2.0.0/16, 10.96.2.0/24), no pin under /sys/fs/bpf/cablemesh, /var/lib/cablemesh empty", node)
			}
		}
	})
}
