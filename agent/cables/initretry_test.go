package cables

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/cable"
)

// flakyDriver's Init fails until failures runs out (negative: always).
type flakyDriver struct {
	*fakedriver.Driver
	failures atomic.Int64
	inits    atomic.Int64
}

var errLeftover = errors.New("link cbl-wg0 exists with type \"tuntap\"")

func (d *flakyDriver) Init(ctx context.Context) error {
	d.inits.Add(1)
	if d.failures.Load() != 0 {
		d.failures.Add(-1)
		return errLeftover
	}
	return d.Driver.Init(ctx)
}

type noMSS struct{}

func (noMSS) Ensure([]string) error { return nil }
func (noMSS) Remove() error         { return nil }

// newRetryCables builds cables running wireguard (the flaky driver) and vxlan.
func newRetryCables(wg *flakyDriver, ready func(context.Context)) *Cables {
	live := config.Live{CableDrivers: []string{"wireguard", "vxlan"}}
	vx := fakedriver.NewNamed("vxlan", 4789)
	log := slog.New(slog.DiscardHandler)
	return New(config.Static{ResyncInterval: time.Minute, Gateway: true}, Deps{Log: log, PairLog: log, MSS: noMSS{}, LocalNode: func() cable.LocalNode { return cable.LocalNode{} },
		OnDriverReady: ready, Live: func() config.Live { return live },
		NewDriver: func(name string, _ cable.LocalNode, _ cable.Settings) (cable.Driver, error) {
			if name == "wireguard" {
				return wg, nil
			}
			return vx, nil
		}})
}

func runningNames(c *Cables) []string {
	var out []string
	for _, d := range c.Running() {
		out = append(out, d.Name())
	}
	return out
}

// A driver whose Init fails at start is initialised again with backoff; once it succeeds it
// runs in config order, the plan is offered it, and the agent is told (to register again).
func TestFailedInitIsRetriedUntilTheDriverRuns(t *testing.T) {
	wg := &flakyDriver{Driver: fakedriver.NewNamed("wireguard", 51820)}
	wg.failures.Store(2)
	var ready atomic.Int64
	c := newRetryCables(wg, func(context.Context) { ready.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := runningNames(c); !slices.Equal(got, []string{"vxlan"}) {
		t.Fatalf("running right after Start: %v, want [vxlan]", got)
	}
	if err := c.DriverSet()["wireguard"]; !errors.Is(err, errLeftover) {
		t.Fatalf("wireguard's error in the driver set: %v, want the Init error", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(runningNames(c), []string{"wireguard", "vxlan"}) {
		if time.Now().After(deadline) {
			t.Fatalf("wireguard not running 5s after Start (%d inits): %v", wg.inits.Load(), runningNames(c))
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(t0)
	// Two retries: after 250ms and 500ms more.
	if took < firstInitRetry+2*firstInitRetry || took > 3*time.Second {
		t.Errorf("running after %s, want after the backoff of two retries (%s)", took, 3*firstInitRetry)
	}
	if wg.inits.Load() != 3 {
		t.Errorf("%d inits, want 3", wg.inits.Load())
	}
	if err, ok := c.DriverSet()["wireguard"]; !ok || err != nil {
		t.Errorf("wireguard in the driver set: %v (present %v), want running", err, ok)
	}
	deadline = time.Now().Add(2 * time.Second)
	for ready.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ready.Load() != 1 {
		t.Errorf("OnDriverReady called %d times, want 1", ready.Load())
	}
	c.mu.Lock()
	r := c.reconciler
	c.mu.Unlock()
	if r == nil {
		t.Error("no reconciler after the driver came up")
	}
}

// Close ends the retries of a driver that never initialises: no Init after it.
func TestCloseEndsTheInitRetries(t *testing.T) {
	wg := &flakyDriver{Driver: fakedriver.NewNamed("wireguard", 51820)}
	wg.failures.Store(-1)
	c := newRetryCables(wg, nil)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * firstInitRetry)
	c.Close()
	n := wg.inits.Load()
	if n < 2 {
		t.Errorf("%d inits before Close, want the first and at least one retry", n)
	}
	time.Sleep(4 * firstInitRetry)
	if got := wg.inits.Load(); got != n {
		t.Errorf("%d inits after Close, %d before", got, n)
	}
	if got := runningNames(c); !slices.Equal(got, []string{"vxlan"}) {
		t.Errorf("running %v, want [vxlan]", got)
	}
}

func TestInitRetryBackoff(t *testing.T) {
	var got []time.Duration
	var d time.Duration
	for range 10 {
		d = nextInitRetry(d)
		got = append(got, d)
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("backoff %v, want %v", got, want)
	}
}
