package netns

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// The agent's xDS server with a real xDS consumer: grpc-go's xDS client. Two clusters;
// west exports demo/grpc (gRPC, port 50051) from backends in its pod namespace, and its gateway
// agent serves xDS on a unix socket (ingress.xds.listen). A proxyless gRPC client, run in west's
// gateway namespace (where the socket is and from where the pod addresses are routed), dials
// xds:///grpc.demo.svc.clusterset.local:50051 with a bootstrap naming only the agent's socket,
// and follows what it is served: adding, un-readying and removing an endpoint (cablectl service
// export against west's agent) changes where its RPCs go, each measured from the export call.

// rpcLine is one call of `xdsgrpc call`.
type rpcLine struct {
	At      int64  `json:"at"`
	Backend string `json:"backend"`
	Err     string `json:"err"`
}

func rpcLines(p *harness.Process) []rpcLine {
	var out []rpcLine
	for _, l := range strings.Split(p.Log(), "\n") {
		var r rpcLine
		if json.Unmarshal([]byte(l), &r) == nil && r.At != 0 {
			out = append(out, r)
		}
	}
	return out
}

// settle waits until the last 25 calls made after since all reached backends of want (with
// all: every backend of want among them) and returns how long the change took to show in the
// RPCs: from since to the last call that still went elsewhere, or (all) to the first call that
// reached each backend of want, whichever is later.
func settle(t *testing.T, p *harness.Process, since time.Time, all bool, want ...string) time.Duration {
	t.Helper()
	const n = 25 // 25 calls at 20 ms: half a second of steady traffic
	ok := func(b string) bool {
		for _, w := range want {
			if b == w {
				return true
			}
		}
		return false
	}
	var took time.Duration
	err := harness.WaitFor(20*time.Second, 100*time.Millisecond, func() (bool, string) {
		var after []rpcLine
		for _, l := range rpcLines(p) {
			if l.At >= since.UnixMilli() {
				after = append(after, l)
			}
		}
		if len(after) < n {
			return false, fmt.Sprintf("%d calls since the change", len(after))
		}
		tail := after[len(after)-n:]
		seen := map[string]bool{}
		for _, l := range tail {
			if !ok(l.Backend) {
				return false, fmt.Sprintf("recent call went to %q (err %q)", l.Backend, l.Err)
			}
			seen[l.Backend] = true
		}
		if all && len(seen) != len(want) {
			return false, fmt.Sprintf("recent calls reached %v, want every one of %v", seen, want)
		}
		took = 0
		for _, l := range after {
			if !ok(l.Backend) {
				took = time.UnixMilli(l.At).Sub(since)
			}
		}
		if all {
			// Also: the first call that reached the newcomer(s).
			for _, w := range want {
				for _, l := range after {
					if l.Backend == w {
						took = max(took, time.UnixMilli(l.At).Sub(since))
						break
					}
				}
			}
		}
		return true, ""
	})
	if err != nil {
		t.Fatalf("RPCs did not settle on %v: %v\nclient log tail:\n%s", want, err, p.LogTail(20))
	}
	return took
}

func TestGRPCXDSClientFollowsTheAgentsXDS(t *testing.T) {
	m := harness.New(t)
	bin := nstest.Binary(t, m.Dir, "./tests/netns/cmd/xdsgrpc")
	sock := filepath.Join(m.Dir, "west", "xds.sock")
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", "")
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "", "ingress: {mode: envoy, xds: {listen: "+sock+"}}\n")
	east.StartAgent("--cleanup-on-exit")
	west.StartAgent("--cleanup-on-exit")
	m.WaitConnected(90*time.Second, east, west)

	// Two backends in west's pod namespace, on addresses of their own.
	var procs []*harness.Process
	t.Cleanup(func() {
		for _, p := range procs {
			_, _ = p.Stop(5 * time.Second)
		}
	})
	for i, ip := range []string{"10.2.0.20", "10.2.0.21"} {
		if _, err := harness.MustRun(m.Ctx, "ip", "-n", west.PodNS, "addr", "add", ip+"/24", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("b%d", i+1)
		p, err := harness.StartProcess("xdsgrpc-"+name, west.PodNS, filepath.Join(m.Dir, "xdsgrpc-"+name+".log"), bin, "serve", "-listen", ip+":50051", "-name", name)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		if err := harness.WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) { return strings.Contains(p.Log(), "listening"), p.Log() }); err != nil {
			t.Fatalf("backend %s: %v", name, err)
		}
	}
	// export changes the export through the agent and returns when the agent acknowledged it
	// (cablectl returns once the agent has it): the time to start a cablectl process is not
	// the mesh's, and under CI's load it alone took half a second.
	export := func(endpoints ...string) time.Time {
		t.Helper()
		args := []string{"service", "export", "grpc", "-n", "demo", "--port", "grpc:50051/TCP", "--socket", west.StatusSocket}
		for _, e := range endpoints {
			args = append(args, "--endpoint", e)
		}
		start := time.Now()
		if r := harness.Run(m.Ctx, m.Bin.Cablectl, args...); r.Err != nil {
			t.Fatalf("export: %s", r)
		}
		if d := time.Since(start); d > 200*time.Millisecond {
			m.Logf("cablectl service export took %v", d)
		}
		return time.Now()
	}
	export("10.2.0.20")

	// The agent allocated the ingress port, published it with the export, and serves xDS.
	var ingressPort uint32
	if err := harness.WaitFor(20*time.Second, 200*time.Millisecond, func() (bool, string) {
		st, err := west.Status()
		if err != nil {
			return false, err.Error()
		}
		if st.Ingress == nil || st.Ingress.XDS == nil || len(st.Ingress.Ports) != 1 || st.Ingress.XDS.Versions["listeners"] == "" {
			return false, fmt.Sprintf("ingress %+v", st.Ingress)
		}
		ingressPort = st.Ingress.Ports[0].IngressPort
		return ingressPort >= 15000 && ingressPort <= 15999, ""
	}); err != nil {
		t.Fatalf("west's ingress: %v", err)
	}
	if err := harness.WaitFor(20*time.Second, 250*time.Millisecond, func() (bool, string) {
		r := m.Cablectl("service", "describe", "grpc", "-n", "demo", "-o", "json")
		return r.Err == nil && strings.Contains(r.Stdout, fmt.Sprintf(`"ingressPort": %d`, ingressPort)), r.String()
	}); err != nil {
		t.Errorf("the broker does not show west's ingress port %d: %v", ingressPort, err)
	}

	// The proxyless client, configured only by the bootstrap naming the agent's socket.
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":"unix://%s","channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"grpc-netns-client","locality":{}}}`, sock)
	client, err := harness.StartProcess("xdsgrpc-client", west.GwNS, filepath.Join(m.Dir, "xdsgrpc-client.log"),
		"env", "GRPC_XDS_BOOTSTRAP_CONFIG="+bootstrap, bin, "call", "-target", "xds:///grpc.demo.svc.clusterset.local:50051", "-interval", "20ms", "-duration", "5m")
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, client)
	start := time.Now()
	m.Logf("first endpoint: RPCs on b1 after %v", settle(t, client, start, true, "b1"))

	var took = map[string]time.Duration{}
	for _, step := range []struct {
		name      string
		endpoints []string
		want      []string
	}{
		{"a second endpoint is added", []string{"10.2.0.20", "10.2.0.21"}, []string{"b1", "b2"}},
		{"the first endpoint is un-readied", []string{"10.2.0.20,ready=false", "10.2.0.21"}, []string{"b2"}},
		{"the second endpoint is removed (first ready again)", []string{"10.2.0.20"}, []string{"b1"}},
	} {
		at := export(step.endpoints...)
		d := settle(t, client, at, true, step.want...)
		took[step.name] = d
		m.Logf("%s: RPCs follow %v after the agent acknowledged the export", step.name, d)
		if d > time.Second {
			t.Errorf("%s: the RPCs took %v to follow the acknowledged export, want under 1s", step.name, d)
		}
	}

	// The client ACKed what it runs: its status row shows the current versions, no NACK.
	st, err := west.Status()
	if err != nil {
		t.Fatal(err)
	}
	var node *statusapi.XDSNode
	for i := range st.Ingress.XDS.Nodes {
		if st.Ingress.XDS.Nodes[i].Node == "grpc-netns-client" {
			node = &st.Ingress.XDS.Nodes[i]
		}
	}
	if node == nil {
		t.Fatalf("west's status lists no xDS node grpc-netns-client: %+v", st.Ingress.XDS)
	}
	for _, ty := range node.Types {
		if ty.NackError != "" || ty.Acked != st.Ingress.XDS.Versions[ty.Type] {
			t.Errorf("grpc client %s: acked %q, current %q, NACK %q", ty.Type, ty.Acked, st.Ingress.XDS.Versions[ty.Type], ty.NackError)
		}
	}
	m.Logf("timings: %v", took)

	t.Run("Envoy takes the same configuration", func(t *testing.T) {
		envoy, err := exec.LookPath("envoy")
		if err != nil {
			t.Skip("no envoy binary on PATH: the Envoy ingress (TCP, SNI, HTTP listeners) is checked by the unit tests' ValidateAll and the ADS client only")
		}
		out := harness.Run(m.Ctx, m.Bin.Agent, "envoy-bootstrap", "--config", west.ConfigPath, "--admin-address", "127.0.0.1:19901")
		if out.Err != nil {
			t.Fatalf("envoy-bootstrap: %s", out)
		}
		bs := filepath.Join(m.Dir, "envoy.yaml")
		if err := os.WriteFile(bs, []byte(out.Stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := harness.StartProcess("envoy", west.GwNS, filepath.Join(m.Dir, "envoy.log"), envoy, "-c", bs, "--base-id", "7")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		if err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			st, err := west.Status()
			if err != nil || st.Ingress == nil || st.Ingress.XDS == nil {
				return false, fmt.Sprint(err)
			}
			for _, n := range st.Ingress.XDS.Nodes {
				if n.Node == "west-gw1-ingress" {
					acked := 0
					for _, ty := range n.Types {
						if ty.NackError != "" {
							return false, "NACK: " + ty.NackError
						}
						if ty.Acked == st.Ingress.XDS.Versions[ty.Type] {
							acked++
						}
					}
					return acked == 5, fmt.Sprintf("%+v", n)
				}
			}
			return false, "envoy not connected"
		}); err != nil {
			t.Fatalf("Envoy did not ACK every type: %v\n%s", err, p.LogTail(30))
		}
		// The TCP listener of the ingress port forwards to the backend.
		r := harness.NSRun(m.Ctx, west.GwNS, "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d && echo connected", ingressPort))
		if r.Err != nil || !strings.Contains(r.Stdout, "connected") {
			t.Errorf("connect to Envoy's ingress port %d: %s", ingressPort, r)
		}
	})
}
