package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

func TestMerge(t *testing.T) {
	failing := func(n int) *Result { return &Result{ConsecutiveFailures: n, LastError: "timeout after 2s"} }
	tests := []struct {
		name      string
		device    cable.State
		deviceMsg string
		probe     *Result
		wantState cable.State
		wantMsg   string
	}{
		{"a connection that is not probed keeps the device's state", cable.StateConnected, "", nil, cable.StateConnected, ""},
		{"a connecting device without probes stays connecting", cable.StateConnecting, "waiting for first handshake", nil,
			cable.StateConnecting, "waiting for first handshake"},
		{"a connected device whose probes answer is connected", cable.StateConnected, "", failing(0), cable.StateConnected, ""},
		{"failures below the threshold do not downgrade a connected device", cable.StateConnected, "", failing(2), cable.StateConnected, ""},
		{"failures at the threshold put a connected device in error", cable.StateConnected, "", failing(3),
			cable.StateError, "health probe: 3 consecutive failures (last: timeout after 2s)"},
		{"failures beyond the threshold keep counting in the message", cable.StateConnected, "", failing(7),
			cable.StateError, "health probe: 7 consecutive failures (last: timeout after 2s)"},
		{"a connecting device whose probes keep failing is in error", cable.StateConnecting, "waiting for first handshake", failing(3),
			cable.StateError, "health probe: 3 consecutive failures (last: timeout after 2s)"},
		{"a device in error keeps its own message even when probes fail", cable.StateError, "last handshake 4m0s ago", failing(5),
			cable.StateError, "last handshake 4m0s ago"},
		{"a device in error stays in error even when probes answer", cable.StateError, "connection is wanted but missing on the device", failing(0),
			cable.StateError, "connection is wanted but missing on the device"},
		{"a recovered probe (no consecutive failures) leaves the device's state", cable.StateConnected, "",
			&Result{ConsecutiveFailures: 0, Failed: 9, LastError: "timeout after 2s"}, cable.StateConnected, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, msg := Merge(tt.device, tt.deviceMsg, tt.probe, 3)
			if st != tt.wantState || msg != tt.wantMsg {
				t.Errorf("Merge = %s %q, want %s %q", st, msg, tt.wantState, tt.wantMsg)
			}
		})
	}
	if got := FailureMessage(1, "x"); got != "health probe: 1 consecutive failure (last: x)" {
		t.Errorf("singular message = %q", got)
	}
}

func TestSettingsDefaults(t *testing.T) {
	s := Settings{}.WithDefaults()
	if s.Period != 300*time.Millisecond || s.Timeout != 300*time.Millisecond || s.FailureThreshold != 3 || s.Window != 128 {
		t.Errorf("defaults = %+v, want 300ms x 3 with a 300ms timeout and 128 samples", s)
	}
	s = Settings{Period: time.Second, Timeout: 500 * time.Millisecond, FailureThreshold: 5, Window: 10}.WithDefaults()
	if s.Period != time.Second || s.Timeout != 500*time.Millisecond || s.FailureThreshold != 5 || s.Window != 10 {
		t.Errorf("set values were overridden: %+v", s)
	}
}

// fakeNet answers pings per destination: up (with an RTT) or down (a timeout).
type fakeNet struct {
	mu      sync.Mutex
	down    map[netip.Addr]bool
	rtt     time.Duration
	opened  map[Target]int
	closed  int
	openErr error
}

func newFakeNet() *fakeNet {
	return &fakeNet{down: map[netip.Addr]bool{}, rtt: 400 * time.Microsecond, opened: map[Target]int{}}
}

func (f *fakeNet) setDown(a netip.Addr, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down[a] = down
}

func (f *fakeNet) newPinger(t Target) (Pinger, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openErr != nil {
		return nil, f.openErr
	}
	f.opened[t]++
	return &fakePinger{n: f, dst: t.Destination}, nil
}

type fakePinger struct {
	n   *fakeNet
	dst netip.Addr
}

func (p *fakePinger) Ping(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	p.n.mu.Lock()
	down, rtt := p.n.down[p.dst], p.n.rtt
	p.n.mu.Unlock()
	if down {
		return 0, &TimeoutError{After: timeout}
	}
	return rtt, nil
}

func (p *fakePinger) Close() error {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	p.n.closed++
	return nil
}

type recorder struct {
	mu       sync.Mutex
	ok, fail map[string]int
	forgot   []string
}

func (r *recorder) Observe(cluster string, _ time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.fail[cluster]++
	} else {
		r.ok[cluster]++
	}
}

func (r *recorder) Forget(cluster string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgot = append(r.forgot, cluster)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for: %s", what)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func target(cluster, dst string) Target {
	return Target{Cluster: cluster, Node: cluster + "-gw", Source: netip.MustParseAddr("10.1.0.1"), Destination: netip.MustParseAddr(dst)}
}

func TestManagerProbesFailsAndRecovers(t *testing.T) {
	n := newFakeNet()
	rec := &recorder{ok: map[string]int{}, fail: map[string]int{}}
	m := NewManager(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 3}, n.newPinger, rec, quiet)
	defer m.Close()

	west := target("west", "10.2.0.1")
	m.Sync([]Target{west})
	eventually(t, "west has RTT figures", func() bool { r, _ := m.Result("west"); return r.HasRTT })
	r, ok := m.Result("west")
	if !ok || r.RTT.Last != 400*time.Microsecond || r.RTT.P99 != 400*time.Microsecond || r.Target != west || !r.Healthy(3) {
		t.Fatalf("result = %+v, %v", r, ok)
	}
	if _, ok := m.Result("north"); ok {
		t.Error("a cluster without a target has a result")
	}

	n.setDown(west.Destination, true)
	eventually(t, "west fails three probes in a row", func() bool { r, _ := m.Result("west"); return r.ConsecutiveFailures >= 3 })
	r, _ = m.Result("west")
	st, msg := Merge(cable.StateConnected, "", &r, 3)
	if st != cable.StateError || !strings.HasPrefix(msg, "health probe: ") || !strings.Contains(msg, "(last: timeout after 5ms)") {
		t.Errorf("after the threshold: %s %q", st, msg)
	}
	if r.Healthy(3) || r.Failed < 3 || !r.HasRTT {
		t.Errorf("failing result = %+v: want unhealthy, failures counted, old RTT kept", r)
	}

	n.setDown(west.Destination, false)
	eventually(t, "west recovers", func() bool { r, _ := m.Result("west"); return r.ConsecutiveFailures == 0 })
	r, _ = m.Result("west")
	if st, _ := Merge(cable.StateConnected, "", &r, 3); st != cable.StateConnected {
		t.Errorf("after recovery the state is %s", st)
	}
	rec.mu.Lock()
	if rec.ok["west"] == 0 || rec.fail["west"] < 3 {
		t.Errorf("observer saw %d successes and %d failures", rec.ok["west"], rec.fail["west"])
	}
	rec.mu.Unlock()
}

func TestManagerSyncStartsStopsAndRestartsProbers(t *testing.T) {
	n := newFakeNet()
	rec := &recorder{ok: map[string]int{}, fail: map[string]int{}}
	m := NewManager(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond}, n.newPinger, rec, quiet)
	defer m.Close()

	west, north := target("west", "10.2.0.1"), target("north", "10.3.0.1")
	m.Sync([]Target{west, north})
	eventually(t, "both probed", func() bool {
		a, _ := m.Result("west")
		b, _ := m.Result("north")
		return a.Sent > 0 && b.Sent > 0
	})

	// The same targets again leave the probers running: counters keep growing, no new socket.
	before, _ := m.Result("west")
	m.Sync([]Target{north, west})
	eventually(t, "west keeps counting", func() bool { r, _ := m.Result("west"); return r.Sent > before.Sent+2 })
	n.mu.Lock()
	if n.opened[west] != 1 {
		t.Errorf("west's pinger opened %d times, want once", n.opened[west])
	}
	n.mu.Unlock()

	// A moved target (new remote node) starts over; a removed one stops and is forgotten.
	moved := target("west", "10.2.0.9")
	moved.Node = "west-gw2"
	m.Sync([]Target{moved})
	if r, ok := m.Result("west"); !ok || r.Target != moved || r.Sent > 1 {
		t.Errorf("moved west = %+v, %v: want a fresh prober for the new target", r, ok)
	}
	if _, ok := m.Result("north"); ok {
		t.Error("north is still probed after its target went away")
	}
	rec.mu.Lock()
	if strings.Join(rec.forgot, ",") != "north,west" && strings.Join(rec.forgot, ",") != "west,north" {
		t.Errorf("observer forgot %v, want north and the old west", rec.forgot)
	}
	rec.mu.Unlock()

	m.Close()
	n.mu.Lock()
	opened := 0
	for _, c := range n.opened {
		opened += c
	}
	if n.closed != opened {
		t.Errorf("%d pingers opened, %d closed", opened, n.closed)
	}
	n.mu.Unlock()
	m.Sync([]Target{west}) // after Close: ignored, must not start anything
	if _, ok := m.Result("west"); ok {
		t.Error("Sync after Close started a prober")
	}
}

func TestManagerCountsASocketThatCannotOpenAsFailure(t *testing.T) {
	n := newFakeNet()
	n.openErr = errors.New("icmp probe to 10.2.0.1: open raw socket on 10.1.0.1: bind: cannot assign requested address")
	m := NewManager(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 2}, n.newPinger, nil, quiet)
	defer m.Close()
	m.Sync([]Target{target("west", "10.2.0.1")})
	eventually(t, "two failures", func() bool { r, _ := m.Result("west"); return r.ConsecutiveFailures >= 2 })
	r, _ := m.Result("west")
	if st, msg := Merge(cable.StateConnected, "", &r, 2); st != cable.StateError || !strings.Contains(msg, "cannot assign requested address") {
		t.Errorf("state %s %q", st, msg)
	}
	n.mu.Lock()
	n.openErr = nil
	n.mu.Unlock()
	eventually(t, "the socket opens at a later period and the probe recovers", func() bool { r, _ := m.Result("west"); return r.ConsecutiveFailures == 0 })
}

// typedNilNet opens nothing: a nil *fakePinger in a non-nil Pinger, with an error, as a
// constructor returning (*T)(nil), err through an interface does.
func typedNilNet(Target) (Pinger, error) {
	var p *fakePinger
	return p, errors.New("open raw socket: bind: cannot assign requested address")
}

func TestManagerSurvivesAPingerConstructorReturningATypedNil(t *testing.T) {
	m := NewManager(Settings{Period: 5 * time.Millisecond, Timeout: 2 * time.Millisecond, FailureThreshold: 2}, typedNilNet, nil, quiet)
	defer m.Close()
	m.Sync([]Target{target("west", "10.2.0.1")})
	// Before the fix the second period called Ping on the nil pointer and crashed the agent.
	eventually(t, "five failures without a crash", func() bool { r, _ := m.Result("west"); return r.ConsecutiveFailures >= 5 })
}

func TestICMPPingerFailsCleanlyForAnAddressThisHostDoesNotHave(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ICMP probes use a raw socket (CAP_NET_RAW)")
	}
	p, err := ICMPPinger(Target{Source: netip.MustParseAddr("192.0.2.77"), Destination: netip.MustParseAddr("192.0.2.78")})
	if err == nil || p != nil {
		t.Fatalf("ICMPPinger from an address not on this host = %#v, %v; want a nil Pinger and an error", p, err)
	}
	if !strings.Contains(err.Error(), "192.0.2.77") {
		t.Errorf("error %q does not name the source address", err)
	}
}

func TestICMPEchoOnLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ICMP probes use a raw socket (CAP_NET_RAW)")
	}
	lo := netip.MustParseAddr("127.0.0.1")
	p, err := NewICMP(lo, lo)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		rtt, err := p.Ping(context.Background(), time.Second)
		if err != nil || rtt <= 0 || rtt > time.Second {
			t.Fatalf("ping %d over loopback: %v, %v", i, rtt, err)
		}
	}
	if _, err := NewICMP(lo, netip.MustParseAddr("::1")); err == nil {
		t.Error("mixed families accepted")
	}
	lo6 := netip.MustParseAddr("::1")
	if p6, err := NewICMP(lo6, lo6); err != nil {
		t.Logf("no IPv6 loopback here, ICMPv6 not checked: %v", err)
	} else {
		defer p6.Close()
		if rtt, err := p6.Ping(context.Background(), time.Second); err != nil || rtt <= 0 {
			t.Errorf("ICMPv6 ping over loopback: %v, %v", rtt, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Ping(ctx, 5*time.Second); err == nil {
		t.Error("a ping with a cancelled context succeeded")
	}
}

func TestOnChangeIsCalledAtTheThresholdAndAtRecoveryOnly(t *testing.T) {
	n := newFakeNet()
	m := NewManager(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 3}, n.newPinger, nil, quiet)
	defer m.Close()
	var mu sync.Mutex
	var calls []string
	m.OnChange(func(cluster string, healthy bool) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("%s=%v", cluster, healthy))
	})
	west := target("west", "10.2.0.1")
	m.Sync([]Target{west})
	eventually(t, "west answers", func() bool { r, _ := m.Result("west"); return r.Sent >= 2 })
	n.setDown(west.Destination, true)
	eventually(t, "a call saying west is down", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 1 })
	r, _ := m.Result("west")
	if r.ConsecutiveFailures < 3 {
		t.Errorf("called after %d failures, want the threshold (3)", r.ConsecutiveFailures)
	}
	n.setDown(west.Destination, false)
	eventually(t, "a call saying west is back", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 2 })
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || calls[0] != "west=false" || calls[1] != "west=true" {
		t.Errorf("calls %v, want west=false then west=true and nothing else", calls)
	}
}

func TestSetSettingsRestartsEveryProberWithTheNewPeriod(t *testing.T) {
	n := newFakeNet()
	m := NewManager(Settings{Period: time.Hour, Timeout: 5 * time.Millisecond}, n.newPinger, nil, quiet)
	defer m.Close()
	west := target("west", "10.2.0.1")
	m.Sync([]Target{west})
	eventually(t, "west probed once", func() bool { r, _ := m.Result("west"); return r.Sent == 1 })
	// With an hour's period no second probe comes; the new 10ms period brings many at once.
	m.SetSettings(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 7})
	if s := m.Settings(); s.Period != 10*time.Millisecond || s.FailureThreshold != 7 || s.Window != DefaultWindow {
		t.Errorf("settings %+v", s)
	}
	eventually(t, "west probed every 10ms", func() bool { r, _ := m.Result("west"); return r.Sent > 3 })
	if r, ok := m.Result("west"); !ok || r.Target != west {
		t.Errorf("west after the change: %+v, %v", r, ok)
	}
	m.Close()
	m.SetSettings(Settings{Period: time.Second}) // after Close: no prober may start
	if _, ok := m.Result("west"); ok {
		t.Error("SetSettings after Close started a prober")
	}
}
