// Package health tests the gateway health probes for real, as root:
//
//   - the prober of agent/health alone: two network namespaces joined by a veth pair, ICMP echo
//     over a raw socket opened inside the first, answered by the kernel of the second; then the
//     answering address is removed (the connection must turn to error after the failure
//     threshold, though its "device" says connected) and restored (it must recover);
//   - the real binaries: a broker and two gateway agents connected by the WireGuard cable, whose
//     `cablectl status` must show the RTT through the tunnel, turn to error when the remote
//     gateway's health-check address goes away, and recover when it comes back.
//
// Every namespace is named cbth-<pid>-... and removed even when a test fails.
package health

import (
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

func TestProberThroughAVethPairSeesRTTThenFailureThenRecovery(t *testing.T) {
	requireRoot(t)

	// Deleting a namespace deletes the veth end inside it, and with it the pair.
	nsA, nsB := prefix.Add(t, "pa"), prefix.Add(t, "pb")
	src, dst := netip.MustParseAddr("10.250.7.1"), netip.MustParseAddr("10.250.7.2")
	nstest.MustRun(t, "ip", "-n", nsA, "link", "add", "cbth-va", "type", "veth", "peer", "name", "cbth-vb", "netns", nsB)
	nstest.MustRun(t, "ip", "-n", nsA, "addr", "add", src.String()+"/24", "dev", "cbth-va")
	nstest.MustRun(t, "ip", "-n", nsB, "addr", "add", dst.String()+"/24", "dev", "cbth-vb")
	for _, ns := range []string{nsA, nsB} {
		nstest.MustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	nstest.MustRun(t, "ip", "-n", nsA, "link", "set", "cbth-va", "up")
	nstest.MustRun(t, "ip", "-n", nsB, "link", "set", "cbth-vb", "up")
	// The kernel activates a link's queue asynchronously (linkwatch, up to a second later) and
	// drops what is sent before; probes sent then would fail for reasons this test is not about.
	nstest.WaitLinkUp(t, nsA, "cbth-va")
	nstest.WaitLinkUp(t, nsB, "cbth-vb")

	handle, err := netns.GetFromName(nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer handle.Close()
	newPinger := func(tg health.Target) (health.Pinger, error) {
		var p health.Pinger
		err := inNamespace(handle, func() error {
			icmp, err := health.NewICMP(tg.Source, tg.Destination)
			if err == nil {
				p = icmp
			}
			return err
		})
		return p, err
	}

	settings := health.Settings{Period: 200 * time.Millisecond, Timeout: 150 * time.Millisecond, FailureThreshold: 3, Window: 32}
	m := health.NewManager(settings, newPinger, nil, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	defer m.Close()
	m.Sync([]health.Target{{Cluster: "b", Node: "b-gw", Source: src, Destination: dst}})

	result := func() health.Result {
		r, ok := m.Result("b")
		if !ok {
			t.Fatal("no result for the probed cluster")
		}
		return r
	}
	// state is what the agent would report for a device that looks connected throughout.
	state := func() (cable.State, string) {
		r := result()
		return health.Merge(cable.StateConnected, "", &r, settings.FailureThreshold)
	}
	waitFor := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < limit {
			if cond() {
				return time.Since(start)
			}
			time.Sleep(10 * time.Millisecond)
		}
		r := result()
		t.Fatalf("timed out after %s waiting for %s; result %+v", limit, what, r)
		return 0
	}

	// 1. RTT figures appear, and they are sane for a veth between two namespaces.
	waitFor("five answered probes", 5*time.Second, func() bool { r := result(); return r.RTT.Samples >= 5 })
	r := result()
	s := r.RTT
	t.Logf("RTT over the veth: last %v min %v avg %v max %v p50 %v p95 %v p99 %v (%d samples, %d sent)",
		s.Last, s.Min, s.Avg, s.Max, s.P50, s.P95, s.P99, s.Samples, r.Sent)
	if !r.HasRTT || s.Min <= 0 || s.Max >= settings.Timeout || !(s.Min <= s.P50 && s.P50 <= s.P95 && s.P95 <= s.P99 && s.P99 <= s.Max) ||
		s.Avg < s.Min || s.Avg > s.Max || r.Failed != 0 {
		t.Errorf("implausible RTT statistics: %+v (failed %d)", s, r.Failed)
	}
	if st, msg := state(); st != cable.StateConnected || msg != "" {
		t.Errorf("state while answering = %s %q", st, msg)
	}

	// 2. The peer address goes away: error after three consecutive failures, not before.
	nstest.MustRun(t, "ip", "-n", nsB, "addr", "del", dst.String()+"/24", "dev", "cbth-vb")
	took := waitFor("the connection to turn to error", 10*time.Second, func() bool { st, _ := state(); return st == cable.StateError })
	st, msg := state()
	t.Logf("error after %v: %s", took.Round(time.Millisecond), msg)
	if !strings.HasPrefix(msg, "health probe: ") || !strings.Contains(msg, " consecutive failures (last: ") {
		t.Errorf("error message = %q", msg)
	}
	if r := result(); r.ConsecutiveFailures < 3 || r.ConsecutiveFailures > 4 {
		t.Errorf("turned to %s with %d consecutive failures, want the threshold (3)", st, r.ConsecutiveFailures)
	}
	// Three failures take at least two periods after the first unanswered probe.
	if min := 2 * settings.Period; took < min-settings.Period {
		t.Errorf("error after only %v; three failures at a %v period cannot be that quick", took, settings.Period)
	}

	// 3. The address comes back: one answer recovers the connection.
	nstest.MustRun(t, "ip", "-n", nsB, "addr", "add", dst.String()+"/24", "dev", "cbth-vb")
	took = waitFor("the connection to recover", 10*time.Second, func() bool { st, _ := state(); return st == cable.StateConnected })
	r = result()
	t.Logf("recovered after %v: sent %d, failed %d, last error %q", took.Round(time.Millisecond), r.Sent, r.Failed, r.LastError)
	if r.Failed < 3 || r.ConsecutiveFailures != 0 || r.LastError == "" {
		t.Errorf("after recovery: %+v", r)
	}
}
