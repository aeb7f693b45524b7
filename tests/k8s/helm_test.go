package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
		rep := m.helmRollUnderStream(t, helm, root, webIP, "60m", "wireguard")
		// Where the kernel has no WireGuard (this host) the tunnel is wireguard-go inside the
		// gateway agent's process. The DaemonSet rolls with maxSurge: the new pod starts beside
		// the old one and takes the node over (agent/handover), so the stream stops only for the
		// agents' hand-over, not for the pod's replacement (docs/helm.md has the timeline).
		const maxStall = 1000
		if rep.LongestStallMs > maxStall {
			t.Errorf("longest stall over wireguard-go %d ms, want at most %d ms", rep.LongestStallMs, maxStall)
		}
	})

	t.Run("on a kernel cable (vxlan) a helm upgrade stalls the stream under 1 s", func(t *testing.T) {
		m.movePair(t, "east", "west", "vxlan", driverPolicy("east-vxlan", "vxlan"))
		t.Cleanup(func() { m.removePolicy(t, "east-vxlan", "east", "west", "wireguard") })
		waitFor(t, 60*time.Second, "client-worker -> "+webIP+" over vxlan", func() error {
			answer, _, err := m.call("east", "client-worker", webIP+":80")
			if err == nil && answer != "hello from west" {
				err = fmt.Errorf("answered %q", answer)
			}
			return err
		})
		rep := m.helmRollUnderStream(t, helm, root, webIP, "70m", "vxlan")
		// The VXLAN device, its routes and its neighbours are the kernel's: they stay while the
		// agent's pod is replaced, so only the agent goes away, not the path.
		const maxStall = 1000
		if rep.LongestStallMs > maxStall {
			t.Errorf("longest stall over vxlan %d ms, want at most %d ms: the kernel's device should carry the stream while the agent is replaced", rep.LongestStallMs, maxStall)
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

// rollEvent is one moment of a gateway agent pod's replacement, by the clock of whoever saw it
// (the test's watch, a container's log, the agent's status): one machine, one clock.
type rollEvent struct {
	At   time.Time
	What string
}

// rollRecorder follows the replacement of cluster c's gateway agent pod: the pods' watch events
// as the test receives them, and the old pod's log as it is written (its log goes with the pod).
type rollRecorder struct {
	m      *mesh
	c      string
	oldPod string

	mu     sync.Mutex
	events []rollEvent
	seen   map[string]bool // "pod/what" already recorded
	oldLog strings.Builder

	stop func()
	wg   sync.WaitGroup
}

// gatewayPodSelector selects the gateway agents' pods (the worker DaemonSet's are cable-agent-worker).
const gatewayPodSelector = "app.kubernetes.io/name=cable-agent"

// recordGatewayRoll starts following the replacement of cluster c's gateway agent pod.
func (m *mesh) recordGatewayRoll(t *testing.T, c string) *rollRecorder {
	t.Helper()
	old := strings.TrimSpace(m.mustKC(c, "", "-n", "cablemesh", "get", "pods", "-l", gatewayPodSelector, "-o", "jsonpath={.items[0].metadata.name}"))
	ctx, cancel := context.WithCancel(context.Background())
	r := &rollRecorder{m: m, c: c, oldPod: old, seen: map[string]bool{}}
	kubeconfig := filepath.Join(m.dir, c, "kubeconfig")

	logs := exec.CommandContext(ctx, m.kubectl, "--kubeconfig", kubeconfig, "-n", "cablemesh", "logs", "-f", "--timestamps", "pod/"+old)
	logs.Stdout = lockedWriter{&r.mu, &r.oldLog}
	watch := exec.CommandContext(ctx, m.kubectl, "--kubeconfig", kubeconfig, "-n", "cablemesh", "get", "pods", "-l", gatewayPodSelector,
		"-w", "--output-watch-events", "-o", "json")
	out, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := logs.Start(); err != nil {
		t.Fatalf("kubectl logs -f %s: %v", old, err)
	}
	if err := watch.Start(); err != nil {
		t.Fatalf("kubectl get pods -w: %v", err)
	}
	r.wg.Go(func() { _ = logs.Wait() })
	r.wg.Go(func() {
		dec := json.NewDecoder(out)
		for {
			var ev podWatchEvent
			if err := dec.Decode(&ev); err != nil {
				break
			}
			r.observe(time.Now(), ev)
		}
		_ = watch.Wait()
	})
	r.stop = func() { cancel(); r.wg.Wait() }
	t.Cleanup(r.stop)
	return r
}

// lockedWriter is a writer whose writes hold mu.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// podWatchEvent is what `kubectl get pods -w --output-watch-events -o json` prints per event.
type podWatchEvent struct {
	Type   string `json:"type"`
	Object struct {
		Metadata struct {
			Name              string  `json:"name"`
			DeletionTimestamp *string `json:"deletionTimestamp"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
		Status struct {
			ContainerStatuses []struct {
				Ready bool `json:"ready"`
				State struct {
					Running    *struct{} `json:"running"`
					Terminated *struct{} `json:"terminated"`
				} `json:"state"`
			} `json:"containerStatuses"`
		} `json:"status"`
	} `json:"object"`
}

// observe records the moments ev shows for the first time: for the old pod its deletion (the
// kubelet's SIGTERM follows at once), its container's end, its removal; for a new pod its
// creation, its node, its container running, Ready.
func (r *rollRecorder) observe(at time.Time, ev podWatchEvent) {
	o := ev.Object
	name := o.Metadata.Name
	var whats []string
	if name == r.oldPod {
		if o.Metadata.DeletionTimestamp != nil {
			whats = append(whats, "old pod: deletion seen by the test's watch (the kubelet sends SIGTERM)")
		}
		if len(o.Status.ContainerStatuses) > 0 && o.Status.ContainerStatuses[0].State.Terminated != nil {
			whats = append(whats, "old pod: container terminated (watch)")
		}
		if ev.Type == "DELETED" {
			whats = append(whats, "old pod: removed from the API (watch)")
		}
	} else {
		whats = append(whats, "new pod: created (watch)")
		if o.Spec.NodeName != "" {
			whats = append(whats, "new pod: bound to its node (watch)")
		}
		if len(o.Status.ContainerStatuses) > 0 {
			cs := o.Status.ContainerStatuses[0]
			if cs.State.Running != nil {
				whats = append(whats, "new pod: container running (watch)")
			}
			if cs.Ready {
				whats = append(whats, "new pod: Ready (watch)")
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range whats {
		if !r.seen[w] {
			r.seen[w] = true
			r.events = append(r.events, rollEvent{At: at, What: w})
		}
	}
}

// agentLogMarks are the agent log lines a timeline shows, by the texts they contain (all of
// them); the first line that has them counts.
var agentLogMarks = []struct {
	contains []string
	what     string
}{
	{[]string{`msg="handing the node over to the next agent`}, "agent: asked for the node by the next agent (hand-over)"},
	{[]string{`msg="the running agent handed the node over"`}, "agent: the running agent handed the node over"},
	{[]string{`msg="node handed over to the next agent; idle until stopped"`}, "agent: handed over, idle"},
	{[]string{`msg="agent stopped (handed over)"`}, "agent: idle agent stopped (last line)"},
	{[]string{`msg="stopping: uninstall or restart"`}, "agent: shutdown asks uninstall or restart"},
	{[]string{`msg="closing the userspace wireguard device`}, "agent: wireguard-go device closing"},
	{[]string{`msg="userspace wireguard device closed"`}, "agent: wireguard-go device closed"},
	{[]string{`msg="restoring the previous run's peer`}, "agent: wireguard peer of the previous run restored"},
	{[]string{`msg="agent stopped"`}, "agent: stopped (last line)"},
	{[]string{`msg="node addresses from the Node object"`}, "agent: node addresses from the Node"},
	{[]string{`msg="kernel has no wireguard`}, "agent: wireguard-go device created"},
	{[]string{`msg="wireguard ready"`}, "agent: wireguard driver initialised"},
	{[]string{`msg="cable driver ready"`, "driver=ipsec"}, "agent: ipsec driver ready (charon up)"},
	{[]string{`msg="cable driver ready"`, "driver=vxlan"}, "agent: vxlan driver ready"},
	{[]string{`msg="cable driver ready"`, "driver=wireguard"}, "agent: wireguard driver ready (every driver initialised)"},
	{[]string{`msg="services load balancer ready"`}, "agent: services load balancer ready"},
	{[]string{`msg="peer configured`}, "agent: wireguard peer configured"},
	{[]string{`msg="no handshake yet: sent a fresh initiation"`}, "agent: first fresh initiation (nudge)"},
	{[]string{`msg="agent ready"`}, "agent: ready (reconciled from its cache)"},
}

// logMarks reads a `kubectl logs --timestamps` output: its first line, and the marks above.
func logMarks(prefix, out string) []rollEvent {
	var evs []rollEvent
	found := map[string]bool{}
	for i, line := range strings.Split(out, "\n") {
		stamp, text, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			continue
		}
		if i == 0 {
			evs = append(evs, rollEvent{At: at, What: prefix + "first log line"})
		}
		for _, mk := range agentLogMarks {
			if !found[mk.what] && containsAll(text, mk.contains) {
				found[mk.what] = true
				evs = append(evs, rollEvent{At: at, What: prefix + mk.what})
			}
		}
	}
	return evs
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// finish stops the recording and returns every event, the new pod's log marks and its first
// handshake with remote (from its status; none when remote is empty) included, in time order. Call it once the rollout is
// done and before the new agent rekeys (2 minutes).
func (r *rollRecorder) finish(t *testing.T, remote string) []rollEvent {
	t.Helper()
	r.stop()
	r.mu.Lock()
	evs := append([]rollEvent(nil), r.events...)
	evs = append(evs, logMarks("old ", r.oldLog.String())...)
	r.mu.Unlock()
	// The old pod may still be terminating (a surge roll deletes it after the new one is ready).
	var newPod string
	for _, p := range strings.Fields(r.m.mustKC(r.c, "", "-n", "cablemesh", "get", "pods", "-l", gatewayPodSelector, "-o", "jsonpath={.items[*].metadata.name}")) {
		if p != r.oldPod {
			newPod = p
		}
	}
	if out, err := r.m.kc(r.c, "", "-n", "cablemesh", "logs", "--timestamps", "pod/"+newPod); err == nil {
		evs = append(evs, logMarks("new ", out)...)
	} else {
		t.Logf("new pod's log: %v", err)
	}
	if remote == "" {
		// Not a wireguard pair: no handshake to show.
	} else if hs, err := r.m.lastHandshake(r.c, remote); err == nil && !hs.IsZero() {
		evs = append(evs, rollEvent{At: hs, What: "new agent: wireguard handshake with " + remote + " (its status)"})
	} else {
		t.Logf("no handshake time from %s's gateway status: %v", r.c, err)
	}
	slices.SortStableFunc(evs, func(a, b rollEvent) int { return a.At.Compare(b.At) })
	return evs
}

// lastHandshake is the last WireGuard handshake c's gateway reports with remote.
func (m *mesh) lastHandshake(c, remote string) (time.Time, error) {
	sock := filepath.Join(m.dir, c, "nodes", "gw", "run", "cablemesh", "agent.sock")
	out, err := exec.Command(filepath.Join(m.bin, "cablectl"), "status", "--socket", sock, "-o", "json").Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("cablectl status --socket %s: %w", sock, err)
	}
	var st struct {
		Connections []struct {
			Cluster       string     `json:"cluster"`
			LastHandshake *time.Time `json:"lastHandshake"`
		} `json:"connections"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return time.Time{}, err
	}
	for _, cn := range st.Connections {
		if cn.Cluster == remote && cn.LastHandshake != nil {
			return *cn.LastHandshake, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s's gateway reports no handshake with %s", c, remote)
}

// formatTimeline prints evs and the stream's stall window relative to the first event named
// by origin (the old pod's SIGTERM), or to the first event when there is none.
func formatTimeline(evs []rollEvent, stallFrom, stallTo time.Time) string {
	if !stallFrom.IsZero() {
		evs = append(append([]rollEvent(nil), evs...),
			rollEvent{At: stallFrom, What: "STREAM: last counter before the longest stall"},
			rollEvent{At: stallTo, What: "STREAM: first counter after it"})
		slices.SortStableFunc(evs, func(a, b rollEvent) int { return a.At.Compare(b.At) })
	}
	if len(evs) == 0 {
		return "(no events)"
	}
	// Time 0 is when the old agent is told to stop: the next agent's hand-over request (a
	// surge roll), else the old pod's deletion (its SIGTERM).
	origin := evs[0].At
	for _, mark := range []string{"old agent: asked for the node by the next agent", "old pod: deletion seen"} {
		if i := slices.IndexFunc(evs, func(e rollEvent) bool { return strings.HasPrefix(e.What, mark) }); i >= 0 {
			origin = evs[i].At
			break
		}
	}
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %+8d ms  %s  %s\n", e.At.Sub(origin).Milliseconds(), e.At.UTC().Format("15:04:05.000"), e.What)
	}
	return b.String()
}

// pairOn waits until both gateways of local and remote have their connection to each other
// connected over driver, and fails with what each says when they do not within 120 s.
func (m *mesh) pairOn(t *testing.T, local, remote, driver string) time.Duration {
	t.Helper()
	return waitFor(t, 120*time.Second, fmt.Sprintf("%s-%s connected over %s on both gateways", local, remote, driver), func() error {
		for _, p := range [][2]string{{local, remote}, {remote, local}} {
			d, state, _, _, err := m.connection(p[0], p[1])
			if err != nil {
				return err
			}
			if d != driver || state != "connected" {
				return fmt.Errorf("%s's gateway: %s on %q, %q", p[0], p[1], d, state)
			}
		}
		return nil
	})
}

// movePair applies policy in cluster c and waits until the pair c-remote is connected over
// driver on both gateways and carries east's worker pod's calls.
func (m *mesh) movePair(t *testing.T, c, remote, driver, policy string) {
	t.Helper()
	applied := time.Now()
	m.mustKC(c, policy, "apply", "-f", "-")
	m.pairOn(t, c, remote, driver)
	t.Logf("%s-%s connected over %s on both gateways %v after the policy was applied", c, remote, driver, time.Since(applied).Round(time.Millisecond))
}

// removePolicy deletes cluster c's policy name and waits until the pair is back on driver (the
// mesh default), so that what runs after finds the mesh as it was.
func (m *mesh) removePolicy(t *testing.T, name, c, remote, driver string) {
	t.Helper()
	if out, err := m.kc(c, "", "delete", "clusterconnectionpolicy", name, "--ignore-not-found"); err != nil {
		t.Errorf("delete the policy %s: %v\n%s", name, err, out)
		return
	}
	d := m.pairOn(t, c, remote, driver)
	t.Logf("policy %s removed: %s-%s back on %s after %v", name, c, remote, driver, d.Round(time.Millisecond))
}

// helmRollUnderStream runs `helm upgrade --set resources.requests.cpu=cpu` of east, which rolls
// both of east's DaemonSets, while east's worker pod reads a counter stream from west's pod at
// webIP across the cable (on driver), and returns the stream's report once the rollout is done.
// It checks the roll happened and the stream neither broke nor lost anything, and logs the
// timeline of the gateway pod's replacement beside the stream's longest stall.
func (m *mesh) helmRollUnderStream(t *testing.T, helm, root, webIP, cpu, driver string) streamReport {
	t.Helper()
	const streamFor = 60 * time.Second
	gens := func() string {
		return m.mustKC("east", "", "-n", "cablemesh", "get", "ds", "cable-agent", "cable-agent-worker", "-o", "jsonpath={.items[*].metadata.generation}")
	}
	before := gens()
	stream := m.startStream(t, streamFor, webIP+":81")
	roll := m.recordGatewayRoll(t, "east")
	start := time.Now()
	// A changed value every operator changes: the agent's resources (both DaemonSets' pods).
	args := append([]string{"upgrade", "cablemesh", filepath.Join(root, "deploy", "helm", "cablemesh"),
		"--reuse-values", "--set", "resources.requests.cpu=" + cpu}, postRenderer(t, m)...)
	if out, err := m.helm(helm, "east", args...); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	for _, ds := range []string{"cable-agent", "cable-agent-worker"} {
		m.mustKC("east", "", "-n", "cablemesh", "rollout", "status", "ds/"+ds, "--timeout", "180s")
	}
	rolled := time.Since(start)
	handshakeWith := ""
	if driver == "wireguard" {
		handshakeWith = "west"
		// The first handshake of the new device, before the rekey two minutes later replaces it.
		waitFor(t, 30*time.Second, "east's gateway handshaken with west", func() error {
			_, err := m.lastHandshake("east", "west")
			return err
		})
	}
	events := roll.finish(t, handshakeWith)
	after := gens()
	if after == before {
		t.Errorf("the DaemonSets' generations %q did not change: nothing rolled", after)
	}
	// The old pods go once the new ones are ready (a surge roll): rollout status may return
	// while they are still terminating.
	waitFor(t, 60*time.Second, "only the new agent pods, requesting cpu "+cpu, func() error {
		got := m.mustKC("east", "", "-n", "cablemesh", "get", "pods", "-l", "app.kubernetes.io/name in (cable-agent,cable-agent-worker)",
			"-o", "jsonpath={.items[*].spec.containers[0].resources.requests.cpu}")
		if got != cpu+" "+cpu {
			return fmt.Errorf("the agent pods request cpu %q, want %s on both nodes", got, cpu)
		}
		return nil
	})
	t.Logf("helm upgrade (cpu %s) and the rollout of both DaemonSets done in %v (generations %s -> %s)", cpu, rolled.Round(time.Millisecond), before, after)
	if rolled > streamFor-10*time.Second {
		t.Errorf("the rollout took %v: the %v stream (started 5 s before it) did not cover it", rolled, streamFor)
	}
	rep := stream()
	t.Logf("stream over %v on %s: %d counters received, longest stall %d ms, %d reconnects, errors %v", streamFor, driver, rep.Received, rep.LongestStallMs, rep.Reconnects, rep.Errors)
	from, to := rep.longestStall()
	t.Logf("timeline of east's gateway agent pod replaced under the stream (%s; ms from the old agent's hand-over request, else its SIGTERM):\n%s", driver, formatTimeline(events, from, to))
	if rep.Reconnects != 0 || rep.Lost != 0 {
		t.Errorf("the stream broke during the upgrade: %d reconnects, %d counters lost (errors %v)", rep.Reconnects, rep.Lost, rep.Errors)
	}
	return rep
}

func TestLogMarksFindTheFirstOfEachMark(t *testing.T) {
	out := "2026-11-28T14:20:00.100000000Z time=x level=INFO msg=\"agent ready\" gateway=true\n" +
		"not a stamped line\n" +
		"2026-11-28T14:20:00.200000000Z time=x level=INFO msg=\"userspace wireguard device closed\"\n" +
		"2026-11-28T14:20:00.300000000Z time=x level=INFO msg=\"agent ready\" gateway=true\n" +
		"2026-11-28T14:20:00.400000000Z time=x level=INFO msg=\"cable driver ready\" cluster=east driver=vxlan\n"
	evs := logMarks("old ", out)
	want := []string{"old first log line", "old agent: ready (reconciled from its cache)", "old agent: wireguard-go device closed", "old agent: vxlan driver ready"}
	if len(evs) != len(want) {
		t.Fatalf("marks %+v, want %v", evs, want)
	}
	for i, w := range want {
		if evs[i].What != w {
			t.Errorf("mark %d: %q, want %q", i, evs[i].What, w)
		}
	}
	if got := evs[2].At.Sub(evs[0].At); got != 100*time.Millisecond {
		t.Errorf("the device closed %v after the first line, want 100ms (the second \"agent ready\" must not count)", got)
	}
}

func TestFormatTimelineCountsFromTheSIGTERM(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 14, 20, 0, 0, time.UTC)
	evs := []rollEvent{
		{At: t0.Add(-time.Second), What: "new pod: created (watch)"},
		{At: t0, What: "old pod: deletion seen by the test's watch (the kubelet sends SIGTERM)"},
	}
	got := formatTimeline(evs, t0.Add(500*time.Millisecond), t0.Add(2*time.Second))
	for _, want := range []string{"   -1000 ms  14:19:59.000  new pod", "      +0 ms  14:20:00.000  old pod", "    +500 ms  14:20:00.500  STREAM: last counter", "   +2000 ms  14:20:02.000  STREAM: first counter"} {
		if !strings.Contains(got, want) {
			t.Errorf("timeline lacks %q:\n%s", want, got)
		}
	}
}
