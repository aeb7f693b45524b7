package wireguard

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestKickSchedule(t *testing.T) {
	low, high := wgtypes.Key{1}, wgtypes.Key{2}
	noJitter := func() time.Duration { return 0 }
	tests := []struct {
		name         string
		ours, theirs wgtypes.Key
		jitter       func() time.Duration
		want         []time.Duration
	}{
		{"the side with the smaller key checks after a second, then doubles", low, high, noJitter,
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
		{"the side with the larger key checks a stagger later first", high, low, noJitter,
			[]time.Duration{2 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
		{"jitter is added to every wait", low, high, func() time.Duration { return 7 * time.Millisecond },
			[]time.Duration{time.Second + 7*time.Millisecond, 2*time.Second + 7*time.Millisecond, 4*time.Second + 7*time.Millisecond, 8*time.Second + 7*time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := defaultKickSchedule(tt.ours, tt.theirs, tt.jitter)
			if len(got) != len(tt.want) {
				t.Fatalf("schedule %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("schedule %v, want %v", got, tt.want)
				}
			}
		})
	}
	for range 100 {
		if j := randomJitter(); j < 0 || j >= kickMaxJitter {
			t.Fatalf("random jitter %v outside [0, %v)", j, kickMaxJitter)
		}
	}
}

func TestDecideKick(t *testing.T) {
	want := testPeer(t)
	on := func(mod func(*wgtypes.Peer)) wgtypes.Peer {
		p := devicePeer(want)
		if mod != nil {
			mod(&p)
		}
		return p
	}
	tests := []struct {
		name  string
		peer  wgtypes.Peer
		found bool
		want  kickDecision
	}{
		{"a matching peer that never shook hands is kicked", on(nil), true, kickNow},
		{"the Unix epoch (kernel) counts as never", on(func(p *wgtypes.Peer) { p.LastHandshakeTime = time.Unix(0, 0) }), true, kickNow},
		{"a peer that shook hands is left alone", on(func(p *wgtypes.Peer) { p.LastHandshakeTime = time.Now() }), true, kickStop},
		{"a peer gone from the device is not added back", wgtypes.Peer{}, false, kickStop},
		{"a peer changed by someone else is left alone", on(func(p *wgtypes.Peer) { p.PersistentKeepaliveInterval = time.Second }), true, kickStop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decideKick(tt.peer, tt.found, want); got != tt.want {
				t.Errorf("decideKick = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestHandshakeWatcher(t *testing.T) {
	tests := []struct {
		name string
		// handshakeAfter, when > 0, makes the peer shake hands on the fake device after that
		// many kicks (0: never).
		handshakeAfter int
		// then runs after the watcher started; it may stop it early.
		then      func(t *testing.T, d *Driver, c *fakeClient)
		wantKicks uint64
		wantPeer  bool
		// wantConfigures counts Disconnect's removal: the watcher's own changes never count.
		wantConfigures uint64
	}{
		{name: "a peer that never shakes hands is re-added the bounded number of times", wantKicks: kickAttempts, wantPeer: true},
		{name: "a peer that shakes hands after the first re-add is left alone from then on", handshakeAfter: 1, wantKicks: 1, wantPeer: true},
		{name: "a peer that shook hands before the first check is never re-added",
			then: func(t *testing.T, d *Driver, c *fakeClient) { c.shakeHands() }, wantKicks: 0, wantPeer: true},
		{name: "Disconnect stops the watcher", then: func(t *testing.T, d *Driver, c *fakeClient) {
			if err := d.Disconnect(context.Background(), "b"); err != nil {
				t.Fatal(err)
			}
		}, wantKicks: 0, wantPeer: false, wantConfigures: 1},
		{name: "a peer removed behind the driver's back is not added again", then: func(t *testing.T, d *Driver, c *fakeClient) {
			c.mu.Lock()
			c.peers = nil
			c.mu.Unlock()
		}, wantKicks: 0, wantPeer: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// With something to do first, the first check waits long enough for it.
			first := 5 * time.Millisecond
			if tt.then != nil {
				first = 300 * time.Millisecond
			}
			d, c, want := newWatchedDriver(t, tt.handshakeAfter, first)
			if tt.then != nil {
				tt.then(t, d, c)
			}
			waitWatchersIdle(t, d)
			if got := d.Stats().HandshakeKicks; got != tt.wantKicks {
				t.Errorf("HandshakeKicks = %d, want %d", got, tt.wantKicks)
			}
			if got := d.Stats().Configures; got != tt.wantConfigures {
				t.Errorf("Configures = %d, want %d: the watcher's changes must not count as Connect's", got, tt.wantConfigures)
			}
			c.mu.Lock()
			p, found := c.peers[want.PublicKey]
			c.mu.Unlock()
			if found != tt.wantPeer {
				t.Fatalf("peer on the device: %v, want %v", found, tt.wantPeer)
			}
			if found && !peerMatches(p, want) {
				t.Errorf("peer after the watcher %+v does not match the wanted one %+v", p, want)
			}
		})
	}
}

func TestCloseStopsHandshakeWatchers(t *testing.T) {
	tests := []struct {
		name string
		stop func(*Driver) error
	}{
		{"Close stops the watchers and waits for them", func(d *Driver) error { return d.Close() }},
		{"Cleanup stops the watchers and waits for them", func(d *Driver) error { return d.Cleanup(context.Background()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			d, c, _ := newWatchedDriver(t, 0, time.Hour)
			if err := tt.stop(d); err != nil && !errors.Is(err, errFakeClosed) {
				t.Fatal(err)
			}
			// Close and Cleanup return only once every watcher ended: nothing is left running.
			deadline := time.Now().Add(2 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before {
				buf := make([]byte, 1<<16)
				t.Fatalf("%d goroutines after %s, %d before:\n%s", n, tt.name, before, buf[:runtime.Stack(buf, true)])
			}
			if len(d.watches) != 0 {
				t.Errorf("watches left: %v", d.watches)
			}
			if c.kicks() != 0 {
				t.Errorf("a stopped watcher re-added the peer %d times", c.kicks())
			}
		})
	}
}

// newWatchedDriver is a driver as Init leaves it, on a fake device holding the peer of cluster
// b, with a watcher started for it as Connect does, on a schedule of first and then 5ms waits.
func newWatchedDriver(t *testing.T, handshakeAfter int, first time.Duration) (*Driver, *fakeClient, desiredPeer) {
	t.Helper()
	want := testPeer(t)
	c := &fakeClient{peers: map[wgtypes.Key]wgtypes.Peer{want.PublicKey: devicePeer(want)}, handshakeAfter: handshakeAfter}
	ours, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{
		cfg:    config{Interface: "cbl-kicktest"},
		dir:    t.TempDir(),
		log:    slog.New(slog.DiscardHandler),
		key:    ours,
		dev:    fakeDevice{},
		client: c,
		conns:  map[string]storedConn{"b": {Node: "gw", PublicKey: want.PublicKey.String(), Endpoint: want.Endpoint.String(), Subnets: want.Subnets}},
		kickSchedule: func(_, _ wgtypes.Key) []time.Duration {
			out := make([]time.Duration, kickAttempts)
			for i := range out {
				out[i] = 5 * time.Millisecond
			}
			out[0] = first
			return out
		},
		watches: map[string]*handshakeWatch{},
	}
	d.ctx, d.stop = context.WithCancel(context.Background())
	t.Cleanup(func() { d.stop(); d.watchers.Wait() })
	d.mu.Lock()
	d.startWatchLocked(want)
	d.mu.Unlock()
	return d, c, want
}

// waitWatchersIdle waits until no watcher runs any more (they all end on their own here).
func waitWatchersIdle(t *testing.T, d *Driver) {
	t.Helper()
	done := make(chan struct{})
	go func() { d.watchers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handshake watcher did not end")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.watches) != 0 {
		t.Errorf("a finished watcher is still registered: %v", d.watches)
	}
}

func testPeer(t *testing.T) desiredPeer {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return desiredPeer{
		Cluster: "b", Node: "gw", PublicKey: k.PublicKey(),
		Endpoint:  netip.MustParseAddrPort("10.250.0.2:51820"),
		Subnets:   []netip.Prefix{netip.MustParsePrefix("10.251.2.0/24")},
		Keepalive: DefaultKeepalive,
	}
}

// devicePeer is the peer a device reports after peerConfig(want) was applied.
func devicePeer(want desiredPeer) wgtypes.Peer {
	pc := peerConfig(want)
	return wgtypes.Peer{PublicKey: pc.PublicKey, Endpoint: pc.Endpoint, PersistentKeepaliveInterval: *pc.PersistentKeepaliveInterval, AllowedIPs: pc.AllowedIPs}
}

type fakeDevice struct{}

func (fakeDevice) Kind() string { return KindKernel }
func (fakeDevice) Close() error { return nil }

var errFakeClosed = errors.New("fake client closed")

// fakeClient is a WireGuard device in memory. A peer that is removed and added again counts as
// a kick; after handshakeAfter kicks (if > 0) the peer added again has shaken hands.
type fakeClient struct {
	mu             sync.Mutex
	peers          map[wgtypes.Key]wgtypes.Peer
	readds         int
	handshakeAfter int
	closed         bool
}

func (c *fakeClient) Device(name string) (*wgtypes.Device, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errFakeClosed
	}
	dev := &wgtypes.Device{Name: name}
	for _, p := range c.peers {
		dev.Peers = append(dev.Peers, p)
	}
	return dev, nil
}

func (c *fakeClient) ConfigureDevice(_ string, cfg wgtypes.Config) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errFakeClosed
	}
	removed := map[wgtypes.Key]bool{}
	for _, pc := range cfg.Peers {
		if pc.Remove {
			delete(c.peers, pc.PublicKey)
			removed[pc.PublicKey] = true
			continue
		}
		p := wgtypes.Peer{PublicKey: pc.PublicKey, Endpoint: pc.Endpoint, AllowedIPs: pc.AllowedIPs}
		if pc.PersistentKeepaliveInterval != nil {
			p.PersistentKeepaliveInterval = *pc.PersistentKeepaliveInterval
		}
		if removed[pc.PublicKey] {
			c.readds++
			if c.handshakeAfter > 0 && c.readds >= c.handshakeAfter {
				p.LastHandshakeTime = time.Now()
			}
		}
		if c.peers == nil {
			c.peers = map[wgtypes.Key]wgtypes.Peer{}
		}
		c.peers[pc.PublicKey] = p
	}
	return nil
}

func (c *fakeClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *fakeClient) kicks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readds
}

func (c *fakeClient) shakeHands() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, p := range c.peers {
		p.LastHandshakeTime = time.Now()
		c.peers[k] = p
	}
}
