package netns

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// PolicyTimeout bounds how long the mesh may take to follow one policy change (applied on every
// agent and every connect pair connected).
const PolicyTimeout = 60 * time.Second

// policyStep is one change an operator makes, and what every pair must be afterwards.
type policyStep struct {
	name string
	// do makes the change and returns when the last command of it returned.
	do       func() time.Time
	wants    harness.Wants
	fallback harness.Want
	// quiet names a pair (from, to) the change must not disturb: a pinger runs across it for the
	// whole step and must lose nothing.
	quiet [2]string
	// explain names pairs whose `connection-policy explain` is logged, and words it must contain.
	explain map[string][]string
}

// propagation is what one step measured.
type propagation struct {
	step               string
	affected           []string
	applied, connected time.Duration
	hostClean          time.Duration
}

// TestSeedPolicies builds a mesh of four clusters labelled like the example of Submariner's connectivity proposal (two
// on-premise, two in the cloud; env production or staging), every gateway running all three
// drivers, and applies the proposal's policies one after another. After every step it checks every
// pair from both ends: connected or not and over which driver, as the agents report it and as the
// host shows it (routes, WireGuard peers, VXLAN FDB, charon's SAs), and that pod-to-pod traffic
// flows exactly between connected pairs. It logs how long each change took to reach every
// affected agent.
func TestSeedPolicies(t *testing.T) {
	harness.RequireRoot(t)
	harness.RequireIPsec(t)
	m := harness.New(t)
	extra := harness.MultiDriverConfig()
	oa := m.AddLabelledCluster("onprem-a", "10.1.0.0/16", "location=on-premise,env=production", extra)
	ob := m.AddLabelledCluster("onprem-b", "10.2.0.0/16", "location=on-premise,env=staging", extra)
	ca := m.AddLabelledCluster("cloud-a", "10.3.0.0/16", "location=cloud,env=production", extra)
	cb := m.AddLabelledCluster("cloud-b", "10.4.0.0/16", "location=cloud,env=staging", extra)
	all := []*harness.Cluster{oa, ob, ca, cb}
	started := time.Now()
	for _, c := range all {
		c.StartAgent()
	}
	wg, vx, ips := harness.Connected(harness.DriverWireGuard), harness.Connected(harness.DriverVXLAN), harness.Connected(harness.DriverIPsec)
	no := harness.NoConnect
	pair := harness.PairKey

	conv := m.WaitWants(2*time.Minute, started, all, nil, wg)
	m.Logf("the default policy (wireguard, full mesh) connected all four clusters %s after the agents started", conv.ConnectedAfter(names(all)...).Round(time.Millisecond))
	for _, c := range all {
		c.StartTCPServer()
	}
	checkMesh(t, m, "default policy", all, nil, wg)

	seedDocs := []string{"03-on-prem.yaml", "04-on-prem-to-cloud.yaml", "05-cloud-a-default.yaml", "06-on-prem-to-cloud-no-connect.yaml"}
	var multi strings.Builder
	for i, f := range seedDocs {
		b, err := os.ReadFile(m.SeedPolicy(f))
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			multi.WriteString("---\n")
		}
		multi.Write(b)
	}
	multiFile := m.PolicyFile("seed-03-to-06.yaml", multi.String())

	steps := []policyStep{
		{
			name: "apply on-prem: vxlan between the on-premise clusters",
			do:   func() time.Time { return m.Apply(m.SeedPolicy("03-on-prem.yaml")) },
			wants: harness.Wants{
				pair("onprem-a", "onprem-b"): vx,
			},
			fallback: wg,
			quiet:    [2]string{"cloud-a", "cloud-b"},
			explain:  map[string][]string{pair("onprem-a", "onprem-b"): {"on-prem"}},
		},
		{
			name: "apply on-prem-to-cloud: ipsec between the production on-premise and cloud clusters",
			do:   func() time.Time { return m.Apply(m.SeedPolicy("04-on-prem-to-cloud.yaml")) },
			wants: harness.Wants{
				pair("onprem-a", "onprem-b"): vx,
				pair("onprem-a", "cloud-a"):  ips,
			},
			fallback: wg,
			quiet:    [2]string{"onprem-b", "onprem-a"},
			explain:  map[string][]string{pair("onprem-a", "cloud-a"): {"on-prem-to-cloud"}},
		},
		{
			name: "apply cloud-a-default: vxlan inside the cloud",
			do:   func() time.Time { return m.Apply(m.SeedPolicy("05-cloud-a-default.yaml")) },
			wants: harness.Wants{
				pair("onprem-a", "onprem-b"): vx,
				pair("onprem-a", "cloud-a"):  ips,
				pair("cloud-a", "cloud-b"):   vx,
			},
			fallback: wg,
			quiet:    [2]string{"onprem-a", "cloud-a"},
			explain:  map[string][]string{pair("cloud-a", "cloud-b"): {"cloud-a-default"}},
		},
		{
			name: "apply on-prem-to-cloud-no-connect: it beats on-prem-to-cloud at equal priority",
			do:   func() time.Time { return m.Apply(m.SeedPolicy("06-on-prem-to-cloud-no-connect.yaml")) },
			wants: harness.Wants{
				pair("onprem-a", "onprem-b"): vx,
				pair("onprem-a", "cloud-a"):  no,
				pair("cloud-a", "cloud-b"):   vx,
			},
			fallback: wg,
			quiet:    [2]string{"onprem-a", "onprem-b"},
			explain:  map[string][]string{pair("onprem-a", "cloud-a"): {"on-prem-to-cloud-no-connect", "conflict"}},
		},
		{
			name:     "delete -f of the four policies in one multi-document file: back to the default",
			do:       func() time.Time { return m.DeletePolicies(multiFile) },
			wants:    nil,
			fallback: wg,
			quiet:    [2]string{"onprem-b", "cloud-b"},
		},
		{
			name: "label database roles, apply client-server-policy: clients reach the server, not each other",
			do: func() time.Time {
				m.Label("cloud-a", "database-role=server")
				m.Label("onprem-a", "database-role=client")
				m.Label("onprem-b", "database-role=client")
				return m.Apply(m.SeedPolicy("07-client-server-policy.yaml"))
			},
			wants: harness.Wants{
				pair("cloud-a", "onprem-a"):  vx,
				pair("cloud-a", "onprem-b"):  vx,
				pair("onprem-a", "onprem-b"): no,
			},
			fallback: wg, // cloud-b has no role: the default connects it to everyone
			quiet:    [2]string{"cloud-b", "onprem-a"},
			explain:  map[string][]string{pair("onprem-a", "onprem-b"): {"client-server-policy"}},
		},
		{
			name: "label cloud-b database-server=true, apply the any-client example: only cloud-b serves",
			do: func() time.Time {
				m.Label("cloud-b", "database-server=true")
				return m.Apply(m.SeedPolicy("08-client-server-any.yaml"))
			},
			wants: harness.Wants{
				pair("cloud-b", "onprem-a"):  vx,
				pair("cloud-b", "onprem-b"):  vx,
				pair("cloud-b", "cloud-a"):   vx,
				pair("onprem-a", "onprem-b"): no,
				pair("onprem-a", "cloud-a"):  no,
				pair("onprem-b", "cloud-a"):  no,
			},
			fallback: wg,
			explain:  map[string][]string{pair("onprem-a", "cloud-a"): {"client-server-policy"}, pair("cloud-b", "cloud-a"): {"client-server-policy"}},
		},
		{
			name:     "delete -f of the any-client example: back to the default",
			do:       func() time.Time { return m.DeletePolicies(m.SeedPolicy("08-client-server-any.yaml")) },
			wants:    nil,
			fallback: wg,
		},
	}

	prev, prevFallback := harness.Wants(nil), wg
	var props []propagation
	for i, s := range steps {
		m.Logf("==== step %d: %s", i+1, s.name)
		var pinger *harness.Process
		if s.quiet[0] != "" {
			from, to := m.Cluster(s.quiet[0]), m.Cluster(s.quiet[1])
			pinger = m.StartPinger(fmt.Sprintf("quiet-%d", i+1), from.PodNS, to.PodIP, 1000, 100*time.Millisecond)
			time.Sleep(500 * time.Millisecond)
		}
		t0 := s.do()
		affected := harness.Changed(all, prev, prevFallback, s.wants, s.fallback)
		conv := m.WaitWants(PolicyTimeout, t0, all, s.wants, s.fallback)
		p := propagation{step: fmt.Sprintf("%d", i+1), affected: affected,
			applied: conv.AppliedAfter(affected...), connected: conv.ConnectedAfter(affected...)}
		clean := waitHostsClean(m, all, s.wants, s.fallback)
		p.hostClean = clean.Sub(t0)
		props = append(props, p)
		m.Logf("step %d propagation: affected agents %v applied the change %s after `cablectl` returned, all their pairs connected after %s, host state exact after %s (slowest status call %s)",
			i+1, affected, p.applied.Round(time.Millisecond), p.connected.Round(time.Millisecond), p.hostClean.Round(time.Millisecond), conv.SlowestStatus.Round(time.Millisecond))
		if pinger != nil {
			// The pinger covers the change and at least 2s after it, so that a disturbance that
			// comes late (an old cable's cleanup) is seen too.
			if d := time.Until(t0.Add(2 * time.Second)); d > 0 {
				time.Sleep(d)
			}
			// ping prints its summary on SIGINT.
			_ = syscall.Kill(pinger.Pid(), syscall.SIGINT)
			if _, err := pinger.Wait(5 * time.Second); err != nil {
				t.Errorf("step %d: %v", i+1, err)
			}
			if res, err := harness.ParsePing(pinger.Log()); err != nil {
				t.Errorf("step %d: pinger %s -> %s: %v", i+1, s.quiet[0], s.quiet[1], err)
			} else if res.Transmitted < 10 || res.Lost() != 0 {
				t.Errorf("step %d (%s) disturbed the unaffected pair %s -> %s: %d of %d pings lost",
					i+1, s.name, s.quiet[0], s.quiet[1], res.Lost(), res.Transmitted)
			} else {
				m.Logf("step %d: unaffected pair %s -> %s lost 0 of %d pings during the change", i+1, s.quiet[0], s.quiet[1], res.Transmitted)
			}
		}
		checkMesh(t, m, fmt.Sprintf("step %d", i+1), all, s.wants, s.fallback)
		for k, words := range s.explain {
			a, b, _ := strings.Cut(k, "<->")
			out := m.Explain(a, b)
			m.Logf("cablectl connection-policy explain %s %s:\n%s", a, b, out)
			for _, word := range words {
				if !strings.Contains(out, word) {
					t.Errorf("step %d: `cablectl connection-policy explain %s %s` does not say %q:\n%s", i+1, a, b, word, out)
				}
			}
		}
		if t.Failed() {
			t.Fatalf("stopping after step %d: the later steps build on it", i+1)
		}
		prev, prevFallback = s.wants, s.fallback
	}
	if r := m.Cablectl("connection-policy", "list"); r.Err != nil {
		t.Errorf("cablectl connection-policy list: %s", r)
	} else {
		m.Logf("cablectl connection-policy list:\n%s", r.Stdout)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "policy propagation (from `cablectl` returning until every affected agent reports the new state):\n")
	fmt.Fprintf(&b, "| step | affected agents | applied (driver/no-connect in status) | connected | host exact (old cable gone) |\n|---|---|---|---|---|\n")
	for _, p := range props {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", p.step, strings.Join(p.affected, " "), p.applied.Round(time.Millisecond),
			p.connected.Round(time.Millisecond), p.hostClean.Round(time.Millisecond))
	}
	m.Logf("%s", b.String())
}

func names(cs []*harness.Cluster) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// waitHostsClean waits until the host view of every gateway matches wants exactly (the new
// cable complete, nothing left of the old one) and returns when it did; on timeout it reports
// the problems as test errors.
func waitHostsClean(m *harness.Mesh, all []*harness.Cluster, wants harness.Wants, fallback harness.Want) time.Time {
	m.T.Helper()
	var problems []string
	err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
		problems, _ = m.CheckHosts(all, wants, fallback)
		return len(problems) == 0, strings.Join(problems, "\n")
	})
	if err != nil {
		m.T.Errorf("the hosts do not show exactly the wanted cables 30s after the agents reported them:\n%s", strings.Join(problems, "\n"))
	}
	return time.Now()
}

// checkMesh checks every pair from both ends, in the agents' status, on the host and with
// traffic.
func checkMesh(t *testing.T, m *harness.Mesh, what string, all []*harness.Cluster, wants harness.Wants, fallback harness.Want) {
	t.Helper()
	for _, c := range all {
		st, err := c.Status()
		if err != nil {
			t.Errorf("%s: status of %s: %v", what, c.Name, err)
			continue
		}
		for _, o := range all {
			if o == c {
				continue
			}
			w := wants.Of(c.Name, o.Name, fallback)
			if applied, connected, desc := harness.Matches(st, o.Name, w); !applied || !connected {
				t.Errorf("%s: status of %s: %s", what, c.Name, desc)
			}
		}
	}
	problems, summary := m.CheckHosts(all, wants, fallback)
	for _, p := range problems {
		t.Errorf("%s: host: %s", what, p)
	}
	m.Logf("%s: host view per pair end:\n  %s", what, strings.Join(summary, "\n  "))
	for _, p := range m.CheckTraffic(all, wants, fallback) {
		t.Errorf("%s: traffic: %s", what, p)
	}
}
