package diagnose

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) *time.Time { t := now.Add(d); return &t }
func ms(v float64) *float64         { return &v }

// healthy is a gateway in east, connected to west over wireguard, with probes, DNS and the load
// balancer on: every check passes with the probes of healthyProbes.
func healthy() *statusapi.Status {
	return &statusapi.Status{
		Cluster: "east", Node: "east-gw1", Gateway: true,
		Broker: statusapi.Broker{Address: "172.31.0.1:7443", Connected: true, Revision: 9,
			CertificateNotAfter: at(90 * 24 * time.Hour), CertificateRenewAt: at(60 * 24 * time.Hour),
			ClockSkewMs: ms(12), ClockSkewUncertaintyMs: ms(1)},
		Decisions: []statusapi.Decision{{Cluster: "west", Connect: true, Driver: "wireguard", Policy: "all"}},
		Drivers:   []statusapi.DriverStatus{{Name: "wireguard", Running: true, Port: 51820}},
		Connections: []statusapi.Connection{{Cluster: "west", Driver: "wireguard", Policy: "all", State: "connected",
			Endpoint: "172.31.0.11:51820", MTU: 1420, LastHandshake: at(-30 * time.Second),
			Health: &statusapi.Health{Probing: true, Healthy: true, Source: "10.1.0.1", Target: "10.2.0.1", ProbesSent: 100, Samples: 100}}},
		Services: &statusapi.Services{ImportsKnown: true,
			DNS:          statusapi.DNSStatus{Enabled: true, Listen: "10.1.0.1:5353"},
			LoadBalancer: statusapi.LoadBalancer{Running: true, CgroupPath: "/sys/fs/cgroup/unified/n", PinDir: "/sys/fs/bpf/n", Services: 2}},
	}
}

func healthyProbes() Probes {
	return Probes{
		MTU:  map[string]MTUProbe{"west": {Source: "10.1.0.1", Target: "10.2.0.1", MTU: 1420, Size: 1392, Sent: 3, Received: 3, SmallSent: 3, SmallReceived: 3}},
		DNS:  &DNSProbe{Server: "10.1.0.1:5353", Rcode: "NOERROR", Answer: "1.0.0"},
		EBPF: &EBPFProbe{PinDir: "/sys/fs/bpf/n", CgroupPath: "/sys/fs/cgroup/unified/n", Hooks: 8},
	}
}

func find(rs []Result, check string) (Result, bool) {
	for _, r := range rs {
		if r.Check == check {
			return r, true
		}
	}
	return Result{}, false
}

func TestAHealthyNodePassesEveryCheck(t *testing.T) {
	rs := Run(healthy(), healthyProbes(), now)
	want := []string{"broker", "certificate", "clock-skew", "connected west", "cable-port west", "mtu west", "dns", "ebpf"}
	if len(rs) != len(want) {
		t.Fatalf("got %d results %+v, want %v", len(rs), rs, want)
	}
	for i, r := range rs {
		if r.Check != want[i] || !r.OK || r.Hint != "" {
			t.Errorf("result %d: %+v, want %s passing without a hint", i, r, want[i])
		}
	}
	if Failed(rs) != 0 {
		t.Errorf("Failed = %d", Failed(rs))
	}
	if r, _ := find(rs, "certificate"); !strings.Contains(r.Message, "valid for 90 more days") {
		t.Errorf("certificate: %q, want the days until expiry", r.Message)
	}
}

func TestEachFaultFailsItsCheckAndNamesIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(*statusapi.Status, *Probes)
		check  string
		says   []string
	}{
		{"broker unreachable", func(s *statusapi.Status, _ *Probes) {
			s.Broker.Connected, s.Broker.Error = false, "connection refused"
		}, "broker", []string{"not connected", "172.31.0.1:7443", "connection refused"}},
		{"certificate refused", func(s *statusapi.Status, _ *Probes) {
			s.Broker.CertificateRefused = true
		}, "broker", []string{"refused this node's certificate"}},
		{"certificate expired", func(s *statusapi.Status, _ *Probes) {
			s.Broker.CertificateNotAfter = at(-49 * time.Hour)
		}, "certificate", []string{"expired", "3 days ago"}},
		{"certificate renewal overdue and close to expiry", func(s *statusapi.Status, _ *Probes) {
			s.Broker.CertificateNotAfter, s.Broker.CertificateRenewAt = at(3*24*time.Hour+time.Hour), at(-24*time.Hour)
		}, "certificate", []string{"expires in 3 days", "has not happened"}},
		{"no certificate", func(s *statusapi.Status, _ *Probes) { s.Broker.CertificateNotAfter = nil }, "certificate", []string{"no node certificate"}},
		{"clock ahead", func(s *statusapi.Status, _ *Probes) {
			s.Broker.ClockSkewMs = ms(-4200)
		}, "clock-skew", []string{"4.2s behind", "more than 1s"}},
		{"pair wanted but not connected", func(s *statusapi.Status, _ *Probes) {
			s.Connections[0].State, s.Connections[0].Message = "error", "health probe: 3 consecutive failures"
		}, "connected west", []string{"policy all connects east and west over wireguard", "error", "3 consecutive failures"}},
		{"pair wanted and missing", func(s *statusapi.Status, p *Probes) {
			s.Connections = nil
			p.MTU = nil
		}, "connected west", []string{"no connection to west"}},
		{"no wireguard handshake", func(s *statusapi.Status, _ *Probes) {
			s.Connections[0].LastHandshake = nil
		}, "cable-port west", []string{"no WireGuard handshake", "172.31.0.11:51820", "UDP 51820"}},
		{"stale wireguard handshake under probes", func(s *statusapi.Status, _ *Probes) {
			s.Connections[0].LastHandshake = at(-5 * time.Minute)
		}, "cable-port west", []string{"5m0s ago", "UDP 51820"}},
		{"vxlan probes fail", func(s *statusapi.Status, _ *Probes) {
			c := &s.Connections[0]
			c.Driver, c.Endpoint = "vxlan", "172.31.0.11:4789"
			c.Health.Healthy, c.Health.ConsecutiveFailures, c.Health.ProbesFailed, c.Health.LastError = false, 5, 5, "timeout"
		}, "cable-port west", []string{"probes through the vxlan tunnel", "UDP 4789", "5 in a row", "timeout"}},
		{"ipsec without IKE", func(s *statusapi.Status, _ *Probes) {
			c := &s.Connections[0]
			c.Driver, c.Endpoint, c.State, c.LastHandshake = "ipsec", "172.31.0.11:500", "connecting", nil
			s.Drivers = append(s.Drivers, statusapi.DriverStatus{Name: "ipsec", Running: true, Daemon: &statusapi.Daemon{Name: "charon", PID: 7, State: "running", Answering: true}})
		}, "cable-port west", []string{"no IKE_SA", "UDP 500"}},
		{"mtu black hole", func(_ *statusapi.Status, p *Probes) {
			m := p.MTU["west"]
			m.Received = 0
			p.MTU["west"] = m
		}, "mtu west", []string{"MTU black hole", "1420-byte", "0/3 answered", "small ones cross (3/3)"}},
		{"mtu unmeasurable", func(_ *statusapi.Status, p *Probes) {
			p.MTU["west"] = MTUProbe{Source: "a", Target: "b", MTU: 1420, Sent: 3, SmallSent: 3}
		}, "mtu west", []string{"no answer through the cable at all"}},
		{"mtu probe refused locally", func(_ *statusapi.Status, p *Probes) {
			p.MTU["west"] = MTUProbe{Source: "a", Target: "b", MTU: 1420, Error: "ping: local error: message too long, mtu=1400"}
		}, "mtu west", []string{"could not run", "mtu=1400"}},
		{"charon stopped", func(s *statusapi.Status, _ *Probes) {
			s.Drivers = append(s.Drivers, statusapi.DriverStatus{Name: "ipsec", Running: true,
				Daemon: &statusapi.Daemon{Name: "charon", PID: 4242, State: "stopped", Control: "/x/charon.vici", Error: "no answer to version within 1s"}})
		}, "charon", []string{"pid 4242", "stopped", "no answer"}},
		{"charon hangs", func(s *statusapi.Status, _ *Probes) {
			s.Drivers = append(s.Drivers, statusapi.DriverStatus{Name: "ipsec", Running: true,
				Daemon: &statusapi.Daemon{Name: "charon", PID: 4242, State: "running", Control: "/x/charon.vici", Error: "timeout"}})
		}, "charon", []string{"does not answer on /x/charon.vici"}},
		{"ipsec driver down", func(s *statusapi.Status, _ *Probes) {
			s.Drivers = append(s.Drivers, statusapi.DriverStatus{Name: "ipsec", Error: "charon not installed"})
		}, "charon", []string{"does not run: charon not installed"}},
		{"vxlan+ipsec charon stopped", func(s *statusapi.Status, _ *Probes) {
			s.Drivers = append(s.Drivers, statusapi.DriverStatus{Name: "vxlan+ipsec", Running: true,
				Daemon: &statusapi.Daemon{Name: "charon", PID: 4343, State: "stopped", Control: "/x/vxlan+ipsec/charon.vici", Error: "no answer to version within 1s"}})
		}, "charon vxlan+ipsec", []string{"charon of vxlan+ipsec", "pid 4343", "stopped", "no answer"}},
		{"vxlan+ipsec used but not run", func(s *statusapi.Status, _ *Probes) {
			s.Connections = append(s.Connections, statusapi.Connection{Cluster: "north", Driver: "vxlan+ipsec", State: "connected"})
		}, "charon vxlan+ipsec", []string{"a pair uses vxlan+ipsec", "does not run the vxlan+ipsec driver"}},
		{"dns silent", func(_ *statusapi.Status, p *Probes) {
			p.DNS = &DNSProbe{Server: "10.1.0.1:5353", Error: "i/o timeout"}
		}, "dns", []string{"no answer from 10.1.0.1:5353", "i/o timeout"}},
		{"dns servfail before imports", func(s *statusapi.Status, p *Probes) {
			s.Services.ImportsKnown = false
			p.DNS = &DNSProbe{Server: "10.1.0.1:5353", Rcode: "SERVFAIL"}
		}, "dns", []string{"SERVFAIL", "not received the imports"}},
		{"ebpf detached", func(_ *statusapi.Status, p *Probes) {
			p.EBPF.Detached = []string{"connect4"}
		}, "ebpf", []string{"nothing attached to /sys/fs/cgroup/unified/n for connect4"}},
		{"ebpf pin gone", func(_ *statusapi.Status, p *Probes) {
			p.EBPF.MissingPins = []string{"sendmsg4"}
		}, "ebpf", []string{"no pin under /sys/fs/bpf/n for sendmsg4"}},
		{"load balancer down", func(s *statusapi.Status, _ *Probes) {
			s.Services.LoadBalancer.Running, s.Services.LoadBalancer.Error = false, "bpffs not mounted"
		}, "ebpf", []string{"does not run: bpffs not mounted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, p := healthy(), healthyProbes()
			tc.break_(s, &p)
			rs := Run(s, p, now)
			r, ok := find(rs, tc.check)
			if !ok {
				t.Fatalf("no %q check in %+v", tc.check, rs)
			}
			if r.OK || r.Hint == "" {
				t.Errorf("%s: %+v, want a failure with a hint", tc.check, r)
			}
			for _, w := range tc.says {
				if !strings.Contains(r.Message, w) {
					t.Errorf("%s message %q does not say %q", tc.check, r.Message, w)
				}
			}
		})
	}
}

func TestAFaultFailsOnlyItsOwnChecks(t *testing.T) {
	// An MTU black hole leaves the handshake and the probes (small packets) alone: only the MTU
	// check fails, so diagnose names the fault rather than everything at once.
	s, p := healthy(), healthyProbes()
	m := p.MTU["west"]
	m.Received = 0
	p.MTU["west"] = m
	rs := Run(s, p, now)
	if Failed(rs) != 1 {
		t.Errorf("%d failures, want only mtu west: %+v", Failed(rs), rs)
	}
}

func TestDiagnoseRunOutsideTheAgentsNamespaceSaysSo(t *testing.T) {
	p := healthyProbes()
	p.MTU["west"] = MTUProbe{Source: "10.1.0.1", Target: "10.2.0.1", MTU: 1420, Error: "ping: exit status 2: ping: bind icmp socket: Cannot assign requested address"}
	r, _ := find(Run(healthy(), p, now), "mtu west")
	if r.OK || !strings.Contains(r.Hint, "in the agent's network namespace") {
		t.Errorf("mtu west from elsewhere: %+v, want a hint to run it in the agent's namespace", r)
	}
}

func TestChecksThatDoNotApplyAreLeftOut(t *testing.T) {
	s := healthy()
	s.Services = nil
	rs := Run(s, Probes{MTU: healthyProbes().MTU}, now)
	for _, c := range []string{"dns", "ebpf", "charon"} {
		if _, ok := find(rs, c); ok {
			t.Errorf("%s checked on a node without services or ipsec", c)
		}
	}
	// Without probes the MTU is not measured: said, not failed.
	rs = Run(healthy(), Probes{DNS: healthyProbes().DNS, EBPF: healthyProbes().EBPF}, now)
	if r, _ := find(rs, "mtu west"); !r.OK || !strings.Contains(r.Message, "not probed") {
		t.Errorf("mtu west without a probe: %+v", r)
	}
	// A non-gateway's clock is not measured.
	s = healthy()
	s.Gateway, s.Broker.ClockSkewMs = false, nil
	if r, _ := find(Run(s, healthyProbes(), now), "clock-skew"); !r.OK || !strings.Contains(r.Message, "only gateways") {
		t.Errorf("clock-skew on a non-gateway: %+v", r)
	}
}

func TestEachCharonDriverIsCheckedOnItsOwn(t *testing.T) {
	// A gateway with only vxlan+ipsec runs that driver's charon: it is checked, under its own
	// name, with the driver's state directory in the hint; no ipsec check is made up.
	s := healthy()
	s.Drivers = []statusapi.DriverStatus{{Name: "vxlan+ipsec", Running: true,
		Daemon: &statusapi.Daemon{Name: "charon", PID: 51, State: "stopped", Control: "/x/vxlan+ipsec/charon.vici"}}}
	rs := Run(s, healthyProbes(), now)
	if _, ok := find(rs, "charon"); ok {
		t.Errorf("an ipsec charon checked on a gateway without ipsec: %+v", rs)
	}
	r, ok := find(rs, "charon vxlan+ipsec")
	if !ok {
		t.Fatalf("no charon vxlan+ipsec check on a gateway running vxlan+ipsec: %+v", rs)
	}
	if r.OK || !strings.Contains(r.Message, "pid 51") || !strings.Contains(r.Hint, "STATEDIR/vxlan+ipsec/charon.log") {
		t.Errorf("charon vxlan+ipsec: %+v, want a failure naming pid 51 and the driver's charon.log", r)
	}

	// With both drivers, each charon has its result, ipsec's first: a stopped one is not hidden
	// behind a healthy one.
	s.Drivers = append([]statusapi.DriverStatus{{Name: "ipsec", Running: true,
		Daemon: &statusapi.Daemon{Name: "charon", PID: 50, State: "running", Control: "/x/ipsec/charon.vici", Answering: true}}}, s.Drivers...)
	rs = Run(s, healthyProbes(), now)
	var got []string
	for _, r := range rs {
		if strings.HasPrefix(r.Check, "charon") {
			got = append(got, r.Check)
		}
	}
	if strings.Join(got, ",") != "charon,charon vxlan+ipsec" {
		t.Errorf("charon checks %v, want charon then charon vxlan+ipsec", got)
	}
	if r, _ := find(rs, "charon"); !r.OK || !strings.Contains(r.Message, "pid 50") {
		t.Errorf("charon (ipsec): %+v, want a pass for pid 50", r)
	}
	if r, _ := find(rs, "charon vxlan+ipsec"); r.OK {
		t.Errorf("charon vxlan+ipsec: %+v, want the stopped charon to fail", r)
	}

	// A healthy vxlan+ipsec charon passes.
	s.Drivers[1].Daemon.State, s.Drivers[1].Daemon.Answering = "running", true
	if r, _ := find(Run(s, healthyProbes(), now), "charon vxlan+ipsec"); !r.OK || r.Hint != "" {
		t.Errorf("charon vxlan+ipsec running: %+v, want a pass", r)
	}
}

func TestClockSkewWithinTheMeasurementsUncertaintyPasses(t *testing.T) {
	s := healthy()
	s.Broker.ClockSkewMs, s.Broker.ClockSkewUncertaintyMs = ms(1500), ms(600)
	if r, _ := find(Run(s, healthyProbes(), now), "clock-skew"); !r.OK {
		t.Errorf("1.5s ±0.6s: %+v, want a pass (could be 0.9s)", r)
	}
}

func TestPlanning(t *testing.T) {
	s := healthy()
	s.Connections = append(s.Connections, statusapi.Connection{Cluster: "north", Driver: "vxlan", Health: &statusapi.Health{Probing: false}})
	ts := MTUTargets(s)
	if len(ts) != 1 || ts[0] != (MTUTarget{Cluster: "west", Source: "10.1.0.1", Target: "10.2.0.1", MTU: 1420}) {
		t.Errorf("MTUTargets = %+v, want west only", ts)
	}
	for _, tc := range []struct{ listen, want string }{
		{"10.1.0.1:5353", "10.1.0.1:5353"}, {":53", "127.0.0.1:53"}, {"0.0.0.0:53", "127.0.0.1:53"}, {"[::]:53", "[::1]:53"},
	} {
		s.Services.DNS.Listen = tc.listen
		if got := DNSServer(s); got != tc.want {
			t.Errorf("DNSServer(%q) = %q, want %q", tc.listen, got, tc.want)
		}
	}
	if PayloadSize(1420, "10.2.0.1") != 1392 || PayloadSize(1420, "fd00::1") != 1372 {
		t.Errorf("PayloadSize: %d %d", PayloadSize(1420, "10.2.0.1"), PayloadSize(1420, "fd00::1"))
	}
}
