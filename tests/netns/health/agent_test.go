package health

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// binaries builds cable-broker, cable-agent and cablectl into a temp dir.
func binaries(t *testing.T) string {
	t.Helper()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		t.Fatalf("cannot find the module root: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/cable-broker", "./cmd/cable-agent", "./cmd/cablectl")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the binaries: %v\n%s", err, out)
	}
	return dir
}

// proc is a binary this test started in one of its namespaces.
type proc struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

func start(t *testing.T, name, ns, logPath string, argv ...string) *proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { // owned by the process: ends when it does
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop sends SIGTERM to the process group (the agent re-executes itself in a mount namespace),
// then SIGKILL after a grace period.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	t.Errorf("%s ignored SIGTERM and was killed", p.name)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

func output(t *testing.T, ns string, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	var stdout, stderr strings.Builder
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	last := ""
	for time.Since(start) < limit {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		last = why
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last: %s", limit, what, last)
	return 0
}

type gateway struct {
	name, ns, underlay, podIP, podCIDR string
	config, socket                     string
	agent                              *proc
}

func TestAgentsReportRTTThroughTheTunnelAndProbeFailures(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("builds and runs the real binaries")
	}
	bin := binaries(t)
	dir, err := os.MkdirTemp("", string(prefix)) // short: the status socket path must fit in sun_path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})

	// Underlay: a bridge in its own namespace, one veth per node moved straight into the node.
	ul := prefix.Add(t, "ul")
	brk := prefix.Add(t, "brk")
	gws := []*gateway{
		{name: "east", underlay: "172.31.0.10", podIP: "10.1.0.1", podCIDR: "10.1.0.0/16"},
		{name: "west", underlay: "172.31.0.11", podIP: "10.2.0.1", podCIDR: "10.2.0.0/16"},
	}
	for _, g := range gws {
		g.ns = prefix.Add(t, g.name)
	}
	nstest.MustRun(t, "ip", "-n", ul, "link", "add", "br0", "type", "bridge")
	nstest.MustRun(t, "ip", "-n", ul, "link", "set", "br0", "up")
	attach := func(i int, ns, addr string) {
		u := fmt.Sprintf("u%d", i)
		nstest.MustRun(t, "ip", "-n", ul, "link", "add", u, "type", "veth", "peer", "name", "eth0", "netns", ns)
		nstest.MustRun(t, "ip", "-n", ul, "link", "set", u, "master", "br0", "up")
		nstest.MustRun(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		nstest.MustRun(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		nstest.MustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
		nstest.WaitLinkUp(t, ns, "eth0")
	}
	attach(1, brk, "172.31.0.1")
	for i, g := range gws {
		attach(i+2, g.ns, g.underlay)
		// The gateway's address inside its pod CIDR (its health-check address), on lo: no pod
		// namespace is needed to probe gateway to gateway.
		nstest.MustRun(t, "ip", "-n", g.ns, "addr", "add", g.podIP+"/32", "dev", "lo")
	}

	// Broker, join tokens, agents probing every 500ms with a threshold of 3.
	data := filepath.Join(dir, "broker")
	broker := start(t, "cable-broker", brk, filepath.Join(dir, "broker.log"), filepath.Join(bin, "cable-broker"), "--data-dir", data, "--listen", "172.31.0.1:7443")
	admin := filepath.Join(data, "admin.yaml")
	waitUntil(t, "the broker to answer", 30*time.Second, func() (bool, string) {
		if broker.exited() {
			t.Fatalf("cable-broker exited:\n%s", broker.tail())
		}
		if _, err := os.Stat(admin); err != nil {
			return false, "no admin.yaml yet"
		}
		_, err := output(t, brk, filepath.Join(bin, "cablectl"), "--config", admin, "cluster", "list")
		return err == nil, fmt.Sprint(err)
	})
	for _, g := range gws {
		tok, err := output(t, brk, filepath.Join(bin, "cablectl"), "--config", admin, "cluster", "join-token", g.name, "--pod-cidr", g.podCIDR)
		if err != nil {
			t.Fatal(err)
		}
		gdir := filepath.Join(dir, g.name)
		if err := os.MkdirAll(gdir, 0o700); err != nil {
			t.Fatal(err)
		}
		tokPath := filepath.Join(gdir, "token")
		if err := os.WriteFile(tokPath, []byte(strings.TrimSpace(tok)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		g.socket = filepath.Join(gdir, "agent.sock")
		g.config = filepath.Join(gdir, "agent.yaml")
		cfg := fmt.Sprintf(`cluster: %s
node: %s-gw1
broker: 172.31.0.1:7443
joinTokenFile: %s
stateDir: %s
gateway: true
advertiseAddress: %s
podCIDRs: [%s]
statusSocket: %s
wireguard: {interface: cbth-wg0, port: 51820}
healthCheck: {period: 500ms, timeout: 300ms, failureThreshold: 3}
`, g.name, g.name, tokPath, filepath.Join(gdir, "state"), g.underlay, g.podCIDR, g.socket)
		if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		g.agent = start(t, "cable-agent "+g.name, g.ns, filepath.Join(dir, "agent-"+g.name+".log"), filepath.Join(bin, "cable-agent"), "--config", g.config, "--cleanup-on-exit")
	}
	east, west := gws[0], gws[1]

	status := func(g *gateway) (statusapi.Connection, string) {
		if g.agent.exited() {
			t.Fatalf("agent %s exited:\n%s", g.name, g.agent.tail())
		}
		out, err := output(t, "", filepath.Join(bin, "cablectl"), "status", "--socket", g.socket, "-o", "json")
		if err != nil {
			return statusapi.Connection{}, err.Error()
		}
		var st statusapi.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return statusapi.Connection{}, err.Error()
		}
		if len(st.Connections) != 1 {
			return statusapi.Connection{}, fmt.Sprintf("%d connections", len(st.Connections))
		}
		c := st.Connections[0]
		return c, fmt.Sprintf("%s %s %q rtt %+v health %+v", c.Cluster, c.State, c.Message, c.RTT, c.Health)
	}
	wide := func(g *gateway) string {
		out, _ := output(t, "", filepath.Join(bin, "cablectl"), "status", "--socket", g.socket, "-o", "wide")
		return out
	}

	// 1. Both gateways connect and see RTT figures through the WireGuard tunnel.
	for _, g := range gws {
		waitUntil(t, g.name+" to be connected with RTT figures", 60*time.Second, func() (bool, string) {
			c, desc := status(g)
			return c.State == "connected" && c.RTT != nil && c.Health != nil && c.Health.Samples >= 3, desc
		})
		c, _ := status(g)
		r := c.RTT
		if r.LastMs <= 0 || r.MinMs <= 0 || r.MinMs > r.P50Ms || r.P50Ms > r.P95Ms || r.P95Ms > r.P99Ms || r.P99Ms > r.MaxMs || r.AvgMs > r.MaxMs || r.MaxMs >= 300 {
			t.Errorf("%s: implausible RTT %+v", g.name, r)
		}
		other := gws[1]
		if g == west {
			other = east
		}
		if c.Health.Source != g.podIP || c.Health.Target != other.podIP || !c.Health.Healthy {
			t.Errorf("%s: health %+v, want probes %s -> %s", g.name, c.Health, g.podIP, other.podIP)
		}
		t.Logf("cablectl status -o wide on %s:\n%s", g.name, wide(g))
	}

	// 2. West stops answering east's health-check address: a blackhole route in west for
	// east's address (more specific than the cable's route, which stays as it is). The tunnel and
	// its handshake are fine, but the probes go unanswered, so east reports west in error.
	// (Deleting west's address instead would also delete the cable's routes that use it as
	// source, and the driver would not restore them when it came back.)
	blackhole := []string{"ip", "-n", west.ns, "route", "add", "blackhole", east.podIP + "/32"}
	nstest.MustRun(t, blackhole...)
	took := waitUntil(t, "east to report west in error", 30*time.Second, func() (bool, string) {
		c, desc := status(east)
		return c.State == "error" && strings.HasPrefix(c.Message, "health probe: "), desc
	})
	c, _ := status(east)
	t.Logf("east reports west in error %v after the path broke: %s", took.Round(time.Millisecond), c.Message)
	if c.Health == nil || c.Health.Healthy || c.Health.ConsecutiveFailures < 3 || c.LastHandshake == nil {
		t.Errorf("east's view of west while failing: %+v, health %+v", c, c.Health)
	}
	t.Logf("cablectl status -o wide on east:\n%s", wide(east))

	// West's own probes to east leave through the blackhole too: send errors, not timeouts.
	waitUntil(t, "west to report east in error", 30*time.Second, func() (bool, string) {
		c, desc := status(west)
		return c.State == "error" && strings.HasPrefix(c.Message, "health probe: "), desc
	})
	t.Logf("cablectl status -o wide on west:\n%s", wide(west))

	// 3. The path is repaired: the probes answer again and both report connected.
	blackhole[4] = "del"
	nstest.MustRun(t, blackhole...)
	for _, g := range gws {
		took = waitUntil(t, g.name+" to report its peer connected again", 30*time.Second, func() (bool, string) {
			c, desc := status(g)
			return c.State == "connected" && c.Health != nil && c.Health.Healthy, desc
		})
		c, _ = status(g)
		t.Logf("%s: connected again %v after the repair; probes sent %d, failed %d, last error %q", g.name,
			took.Round(time.Millisecond), c.Health.ProbesSent, c.Health.ProbesFailed, c.Health.LastError)
	}
	for _, g := range gws {
		if g.agent.exited() {
			t.Errorf("agent %s exited:\n%s", g.name, g.agent.tail())
		}
	}
}
