package wireguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// fakeHost is a WireGuard device, its link and the routes over it, in memory. It applies what
// the driver asks as wgctrl and netlink would and counts every change.
type fakeHost struct {
	dev     wgtypes.Device
	link    *linkState // nil: no link
	routes  []route.Spec
	src4    netip.Addr
	changes []string // every change, in order
	closes  int
	// forget makes ConfigureDevice silently drop the allowed IPs (a device that disagrees).
	forget bool
}

func newFakeHost(name string) *fakeHost {
	return &fakeHost{
		dev:  wgtypes.Device{Name: name},
		link: &linkState{Link: route.Link{Index: 7, Name: name}, Type: "wireguard", MTU: 1500},
		src4: netip.MustParseAddr("10.1.0.1"),
	}
}

func (f *fakeHost) Device(name string) (*wgtypes.Device, error) {
	if name != f.dev.Name {
		return nil, fmt.Errorf("no device %s", name)
	}
	d := f.dev
	d.Peers = slices.Clone(f.dev.Peers)
	return &d, nil
}

func (f *fakeHost) ConfigureDevice(name string, cfg wgtypes.Config) error {
	f.changes = append(f.changes, "configure")
	if cfg.PrivateKey != nil {
		f.dev.PrivateKey = *cfg.PrivateKey
	}
	if cfg.ListenPort != nil {
		f.dev.ListenPort = *cfg.ListenPort
	}
	for _, pc := range cfg.Peers {
		i := slices.IndexFunc(f.dev.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == pc.PublicKey })
		if pc.Remove {
			if i >= 0 {
				f.dev.Peers = slices.Delete(f.dev.Peers, i, i+1)
			}
			continue
		}
		if i < 0 {
			f.dev.Peers = append(f.dev.Peers, wgtypes.Peer{PublicKey: pc.PublicKey})
			i = len(f.dev.Peers) - 1
		}
		p := &f.dev.Peers[i]
		if pc.Endpoint != nil {
			p.Endpoint = pc.Endpoint
		}
		if pc.PersistentKeepaliveInterval != nil {
			p.PersistentKeepaliveInterval = *pc.PersistentKeepaliveInterval
		}
		if pc.ReplaceAllowedIPs {
			p.AllowedIPs = nil
		}
		if !f.forget {
			p.AllowedIPs = append(p.AllowedIPs, pc.AllowedIPs...)
		}
	}
	return nil
}

func (f *fakeHost) Link(name string) (linkState, error) {
	if f.link == nil || f.link.Name != name {
		return linkState{}, fmt.Errorf("find link %s: %w", name, errLinkNotFound)
	}
	return *f.link, nil
}

func (f *fakeHost) SetLinkMTU(l linkState, mtu int) error {
	f.changes = append(f.changes, fmt.Sprintf("mtu %d", mtu))
	f.link.MTU = mtu
	return nil
}

func (f *fakeHost) SetLinkUp(l linkState) error {
	f.changes = append(f.changes, "up")
	f.link.Up = true
	return nil
}

func (f *fakeHost) DeleteLink(name string) error {
	f.changes = append(f.changes, "delete link")
	f.link, f.routes = nil, nil
	return nil
}

func (f *fakeHost) Routes(l route.Link) ([]route.Spec, error) { return slices.Clone(f.routes), nil }

func (f *fakeHost) ApplyRoutes(_ *slog.Logger, _ route.Link, plan route.Plan, changed func()) error {
	for _, r := range plan.Delete {
		f.routes = slices.DeleteFunc(f.routes, func(h route.Spec) bool { return h.Dst == r.Dst })
		f.changes = append(f.changes, "route del "+r.String())
		changed()
	}
	for _, r := range plan.Replace {
		f.routes = slices.DeleteFunc(f.routes, func(h route.Spec) bool { return h.Dst == r.Dst })
		f.routes = append(f.routes, r)
		f.changes = append(f.changes, "route replace "+r.String())
		changed()
	}
	return nil
}

func (f *fakeHost) Sources([]netip.Prefix) (netip.Addr, netip.Addr, error) {
	return f.src4, netip.Addr{}, nil
}

func (f *fakeHost) Close() error { f.closes++; return nil }

// fakeDevice stands for the kernel or userspace device.
type fakeDevice struct {
	kind      string
	closed    int
	initiated []wgtypes.Key // every Initiate, in order
}

func (d *fakeDevice) Kind() string      { return d.kind }
func (d *fakeDevice) CanInitiate() bool { return d.kind == KindUserspace }
func (d *fakeDevice) Initiate(k wgtypes.Key) error {
	if !d.CanInitiate() {
		return errCannotInitiate
	}
	d.initiated = append(d.initiated, k)
	return nil
}
func (d *fakeDevice) Close() error { d.closed++; return nil }

// newFakeDriver builds a driver on a fake host with a device of kind, in a fresh state directory.
func newFakeDriver(t *testing.T, kind string) (*Driver, *fakeHost, *fakeDevice) {
	t.Helper()
	node := cable.LocalNode{Cluster: "a", Node: "gw", StateDir: t.TempDir(), LocalSubnets: pfx("10.1.0.0/16"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	d, err := NewDriver(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, dev := newFakeHost(DefaultInterface), &fakeDevice{kind: kind}
	d.host = h
	d.open = func(*slog.Logger, string, int) (wgDevice, error) { return dev, nil }
	// Peers are added at once and never nudged, whichever key is smaller; the tests of the first
	// handshake set their own timing.
	d.timing = handshakeTiming{}
	return d, h, dev
}

func remoteB(key wgtypes.Key, subnets ...string) cable.RemoteEndpoint {
	return cable.RemoteEndpoint{Cluster: "b", Node: "gw", Address: netip.MustParseAddr("10.0.0.2"), Port: 51820,
		Attributes: map[string]string{AttrPublicKey: key.String()}, Subnets: pfx(subnets...)}
}

func TestCallsBeforeInitOrAfterCloseAreNotInitialised(t *testing.T) {
	d, h, _ := newFakeDriver(t, KindKernel)
	ctx := context.Background()
	check := func(when string) {
		t.Helper()
		if err := d.Connect(ctx, remoteB(testKey(t), "10.2.0.0/16"), nil); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Connect %s: %v, want ErrNotInitialised", when, err)
		}
		if err := d.Disconnect(ctx, "b"); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Disconnect %s: %v, want ErrNotInitialised", when, err)
		}
		if _, err := d.Connections(ctx); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Connections %s: %v, want ErrNotInitialised", when, err)
		}
	}
	check("before Init")
	if len(h.changes) != 0 {
		t.Errorf("calls before Init changed the host: %v", h.changes)
	}
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	check("after Close")
}

func TestInitConfiguresTheDeviceAndPrunesWhatNoClusterOwns(t *testing.T) {
	d, h, _ := newFakeDriver(t, KindKernel)
	kb, kc, stranger := testKey(t), testKey(t), testKey(t)
	// What an earlier run left: b's peer and route (kept), c stored but its peer gone (forgotten),
	// a stranger's peer and a route no cluster owns (removed).
	if err := connections(d.dir).Save(map[string]storedConn{
		"b": {Node: "gw", PublicKey: kb.String(), Subnets: pfx("10.2.0.0/16")},
		"c": {Node: "gw", PublicKey: kc.String(), Subnets: pfx("10.3.0.0/16")},
	}); err != nil {
		t.Fatal(err)
	}
	h.dev.Peers = []wgtypes.Peer{{PublicKey: kb}, {PublicKey: stranger}}
	h.routes = []route.Spec{{Dst: pfx("10.2.0.0/16")[0], MTU: 1420}, {Dst: pfx("10.9.0.0/16")[0], MTU: 1420}}
	if err := d.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{"configure", "mtu 1420", "up", "route del 10.9.0.0/16 mtu 1420"}
	if !slices.Equal(h.changes, want) {
		t.Errorf("Init changed %q, want %q", h.changes, want)
	}
	if h.dev.ListenPort != DefaultPort || h.dev.PrivateKey == (wgtypes.Key{}) || d.LocalEndpoint().Attributes[AttrPublicKey] != h.dev.PrivateKey.PublicKey().String() {
		t.Errorf("device port %d key %v; published %v", h.dev.ListenPort, h.dev.PrivateKey, d.LocalEndpoint())
	}
	if len(h.dev.Peers) != 1 || h.dev.Peers[0].PublicKey != kb {
		t.Errorf("peers after Init %v, want only b's", h.dev.Peers)
	}
	stored, err := connections(d.dir).Load()
	if err != nil || len(stored) != 1 || stored["b"].PublicKey != kb.String() {
		t.Errorf("connections.json after Init: %v %v, want only b", stored, err)
	}

	// A restart that finds everything in place changes nothing.
	again, _, _ := newFakeDriver(t, KindKernel)
	again.dir, again.host, h.changes = d.dir, h, nil
	if err := again.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(h.changes) != 0 {
		t.Errorf("a second Init changed %q", h.changes)
	}
}

func TestConnectIsIdempotentAndReadsBeforeWriting(t *testing.T) {
	d, h, _ := newFakeDriver(t, KindKernel)
	ctx := context.Background()
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	kb := testKey(t)
	if err := d.Connect(ctx, remoteB(kb, "10.2.0.0/16"), nil); err != nil {
		t.Fatal(err)
	}
	if len(h.dev.Peers) != 1 || !peerMatches(h.dev.Peers[0], desiredPeer{PublicKey: kb, Endpoint: netip.MustParseAddrPort("10.0.0.2:51820"),
		Subnets: pfx("10.2.0.0/16"), Keepalive: DefaultKeepalive}, false) {
		t.Errorf("peers after Connect %+v", h.dev.Peers)
	}
	wantRoute := route.Spec{Dst: pfx("10.2.0.0/16")[0], Src: h.src4, MTU: 1420}
	if !slices.Equal(h.routes, []route.Spec{wantRoute}) {
		t.Errorf("routes after Connect %v, want %v", h.routes, wantRoute)
	}
	first, changes := d.Stats(), len(h.changes)
	if first.Configures != 2 || first.RouteChanges != 1 { // Init's key and port, Connect's peer
		t.Errorf("stats after the first Connect %+v", first)
	}

	if err := d.Connect(ctx, remoteB(kb, "10.2.0.0/16"), nil); err != nil {
		t.Fatal(err)
	}
	if d.Stats() != first || len(h.changes) != changes {
		t.Errorf("a second Connect with equal inputs changed the host: %q", h.changes[changes:])
	}

	// The remote's key and subnets change: the old peer and the old route go.
	kb2 := testKey(t)
	if err := d.Connect(ctx, remoteB(kb2, "10.4.0.0/16"), nil); err != nil {
		t.Fatal(err)
	}
	if len(h.dev.Peers) != 1 || h.dev.Peers[0].PublicKey != kb2 {
		t.Errorf("peers after a key change %v, want only the new key", h.dev.Peers)
	}
	if len(h.routes) != 1 || h.routes[0].Dst != pfx("10.4.0.0/16")[0] {
		t.Errorf("routes after a subnet change %v", h.routes)
	}
	stored, _ := connections(d.dir).Load()
	if stored["b"].PublicKey != kb2.String() || !slices.Equal(stored["b"].Subnets, pfx("10.4.0.0/16")) {
		t.Errorf("connections.json after the change: %+v", stored)
	}
}

func TestConnectReadsBackWhatTheDeviceKept(t *testing.T) {
	d, h, _ := newFakeDriver(t, KindKernel)
	ctx := context.Background()
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	h.forget = true
	err := d.Connect(ctx, remoteB(testKey(t), "10.2.0.0/16"), nil)
	if err == nil || !strings.Contains(err.Error(), "did not keep the peer configuration") {
		t.Fatalf("Connect to a device that drops the allowed IPs: %v", err)
	}
	if len(h.routes) != 0 {
		t.Errorf("routes installed for a peer the device did not keep: %v", h.routes)
	}
}

func TestDisconnectRemovesOnlyTheClustersPeerAndRoutes(t *testing.T) {
	d, h, _ := newFakeDriver(t, KindKernel)
	ctx := context.Background()
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	kb, kc := testKey(t), testKey(t)
	c := remoteB(kc, "10.3.0.0/16")
	c.Cluster = "c"
	for _, r := range []cable.RemoteEndpoint{remoteB(kb, "10.2.0.0/16"), c} {
		if err := d.Connect(ctx, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Disconnect(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if len(h.dev.Peers) != 1 || h.dev.Peers[0].PublicKey != kc || len(h.routes) != 1 || h.routes[0].Dst != pfx("10.3.0.0/16")[0] {
		t.Errorf("after Disconnect b: peers %v routes %v, want c's alone", h.dev.Peers, h.routes)
	}
	changes := len(h.changes)
	if err := d.Disconnect(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := d.Disconnect(ctx, "nowhere"); err != nil {
		t.Fatal(err)
	}
	if len(h.changes) != changes {
		t.Errorf("Disconnect of nothing changed %q", h.changes[changes:])
	}
	statuses, err := d.Connections(ctx)
	if err != nil || len(statuses) != 1 || statuses[0].Cluster != "c" || statuses[0].State != cable.StateConnecting {
		t.Errorf("Connections = %+v, %v", statuses, err)
	}
	// A peer no cluster claims is reported as an error.
	h.dev.Peers = append(h.dev.Peers, wgtypes.Peer{PublicKey: testKey(t), LastHandshakeTime: time.Now()})
	statuses, _ = d.Connections(ctx)
	if len(statuses) != 2 || statuses[0].Cluster != "" || statuses[0].State != cable.StateError || !strings.Contains(statuses[0].Message, "no known cluster") {
		t.Errorf("a stranger peer: %+v", statuses)
	}
}

func TestCleanupRemovesRoutesDeviceAndStateButKeepsTheKey(t *testing.T) {
	d, h, dev := newFakeDriver(t, KindKernel)
	ctx := context.Background()
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(ctx, remoteB(testKey(t), "10.2.0.0/16"), nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if len(h.routes) != 0 || dev.closed != 1 || h.closes == 0 {
		t.Errorf("after Cleanup: routes %v, device closed %d times, host closed %d times", h.routes, dev.closed, h.closes)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "connections.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("connections.json after Cleanup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, privateKeyFile)); err != nil {
		t.Errorf("private key after Cleanup: %v", err)
	}
	if _, err := d.Connections(ctx); !errors.Is(err, cable.ErrNotInitialised) {
		t.Errorf("Connections after Cleanup: %v", err)
	}

	// Cleanup without Init (an uninstall): the kernel link of that name is ours.
	un, h2, _ := newFakeDriver(t, KindKernel)
	if err := un.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if h2.link != nil {
		t.Errorf("Cleanup without Init left the kernel link: %q", h2.changes)
	}
}

func TestCloseEndsAUserspaceDeviceAndKeepsAKernelOne(t *testing.T) {
	for _, kind := range []string{KindKernel, KindUserspace} {
		t.Run(kind, func(t *testing.T) {
			d, h, dev := newFakeDriver(t, kind)
			ctx := context.Background()
			if err := d.Init(ctx); err != nil {
				t.Fatal(err)
			}
			if err := d.Connect(ctx, remoteB(testKey(t), "10.2.0.0/16"), nil); err != nil {
				t.Fatal(err)
			}
			changes := len(h.changes)
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			if wantClosed := map[string]int{KindKernel: 0, KindUserspace: 1}[kind]; dev.closed != wantClosed || h.closes != 1 {
				t.Errorf("Close: device closed %d times (want %d), host %d times (want 1)", dev.closed, wantClosed, h.closes)
			}
			if len(h.changes) != changes || len(h.routes) != 1 {
				t.Errorf("Close changed host state that outlives the process: %q", h.changes[changes:])
			}
			if _, err := os.Stat(filepath.Join(d.dir, "connections.json")); err != nil {
				t.Errorf("Close removed connections.json: %v", err)
			}
		})
	}
}

// handshakeDriver is a driver on a fake host with the real first-handshake timing, a fake clock
// (advance moves it) and its watcher stopped: the test runs the watcher's steps itself.
func handshakeDriver(t *testing.T, kind string) (d *Driver, h *fakeHost, dev *fakeDevice, advance func(time.Duration)) {
	t.Helper()
	d, h, dev = newFakeDriver(t, kind)
	d.timing = defaultHandshakeTiming()
	now := time.Unix(1_800_000_000, 0)
	d.now = func() time.Time { return now }
	if err := d.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.stopWatcher()
	return d, h, dev, func(dt time.Duration) { now = now.Add(dt); d.handshakeStep() }
}

// remoteKey returns a remote key for which d is the initiator (or the responder).
func remoteKey(t *testing.T, d *Driver, initiator bool) wgtypes.Key {
	t.Helper()
	for {
		k := testKey(t)
		if initiates(d.key.PublicKey(), k) == initiator {
			return k
		}
	}
}

func remoteOfKind(k wgtypes.Key, kind string) cable.RemoteEndpoint {
	r := remoteB(k, "10.2.0.0/16")
	if kind != "" {
		r.Attributes[AttrDevice] = kind
	}
	return r
}

func TestAnAssistedResponderHoldsANewPeerBackUntilItsFirstHandshake(t *testing.T) {
	d, h, _, advance := handshakeDriver(t, KindUserspace)
	ctx := context.Background()
	if got := d.LocalEndpoint().Attributes[AttrDevice]; got != KindUserspace {
		t.Errorf("published device kind %q", got)
	}
	k := remoteKey(t, d, false)
	r := remoteOfKind(k, KindUserspace)
	if err := d.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	p := h.dev.Peers[0]
	if len(h.dev.Peers) != 1 || p.Endpoint != nil || p.PersistentKeepaliveInterval != 0 || len(p.AllowedIPs) != 1 {
		t.Fatalf("held-back peer %+v, want allowed IPs but no endpoint and no keepalive", h.dev.Peers)
	}
	if len(h.routes) != 1 {
		t.Errorf("routes %v: the subnets are routed to the device at once", h.routes)
	}
	st, _ := d.Connections(ctx)
	if len(st) != 1 || st[0].State != cable.StateConnecting || !strings.Contains(st[0].Message, "this end answers") || len(st[0].Subnets) != 1 {
		t.Errorf("status while held back: %+v", st)
	}
	stats, changes := d.Stats(), len(h.changes)
	if err := d.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	advance(time.Second)
	if d.Stats() != stats || len(h.changes) != changes {
		t.Errorf("a second Connect or a step without handshake changed %q", h.changes[changes:])
	}

	// The initiator's initiation is answered; its first packet confirms the session.
	h.dev.Peers[0].Endpoint = &net.UDPAddr{IP: net.ParseIP("10.0.0.2"), Port: 51820}
	h.dev.Peers[0].LastHandshakeTime = time.Unix(1_800_000_001, 0)
	advance(watchInterval)
	p = h.dev.Peers[0]
	if !peerMatches(p, desiredPeer{PublicKey: k, Endpoint: netip.MustParseAddrPort("10.0.0.2:51820"), Subnets: pfx("10.2.0.0/16"), Keepalive: DefaultKeepalive}, false) {
		t.Errorf("after the first handshake: %+v, want the full configuration", p)
	}
	if hs := d.HandshakeStats(); hs.Releases != 1 || hs.Initiations != 0 || d.Stats() != stats || !d.watch.empty() {
		t.Errorf("handshake stats %+v, stats %+v (want unchanged), watch empty %v", hs, d.Stats(), d.watch.empty())
	}
	st, _ = d.Connections(ctx)
	if st[0].State != cable.StateConnected {
		t.Errorf("status after the handshake: %+v", st[0])
	}
}

func TestAnAssistedInitiatorNudgesUntilTheFirstHandshake(t *testing.T) {
	d, h, dev, advance := handshakeDriver(t, KindUserspace)
	ctx := context.Background()
	k := remoteKey(t, d, true)
	if err := d.Connect(ctx, remoteOfKind(k, KindUserspace), nil); err != nil {
		t.Fatal(err)
	}
	if !deviceHolds(&h.dev, desiredPeer{PublicKey: k, Endpoint: netip.MustParseAddrPort("10.0.0.2:51820"), Subnets: pfx("10.2.0.0/16"), Keepalive: DefaultKeepalive}, false) {
		t.Fatalf("initiator's peer %+v, want the full configuration at once", h.dev.Peers)
	}
	st, _ := d.Connections(ctx)
	if st[0].State != cable.StateConnecting {
		t.Errorf("status before any handshake: %+v", st[0])
	}
	advance(40 * time.Millisecond)
	if len(dev.initiated) != 0 {
		t.Errorf("nudged after 40ms")
	}
	advance(10 * time.Millisecond)
	advance(50 * time.Millisecond)
	if len(dev.initiated) != 2 || dev.initiated[0] != k {
		t.Errorf("initiations %v after 100ms, want two to %s", dev.initiated, k)
	}
	peers := len(h.dev.Peers)
	h.dev.Peers[0].LastHandshakeTime = time.Unix(1_800_000_001, 0)
	for range 100 {
		advance(50 * time.Millisecond)
	}
	if len(dev.initiated) != 2 || d.HandshakeStats().Initiations != 2 || !d.watch.empty() || len(h.dev.Peers) != peers {
		t.Errorf("after the first handshake: initiations %v, stats %+v, peers %d (was %d)", dev.initiated, d.HandshakeStats(), len(h.dev.Peers), peers)
	}
}

func TestAPlainResponderAddsANewPeerAMomentLater(t *testing.T) {
	d, h, _, advance := handshakeDriver(t, KindKernel)
	ctx := context.Background()
	k := remoteKey(t, d, false)
	r := remoteOfKind(k, "") // a node that does not publish its kind
	if err := d.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	if len(h.dev.Peers) != 0 || len(h.routes) != 1 {
		t.Fatalf("right after Connect: peers %v routes %v, want no peer yet and the route", h.dev.Peers, h.routes)
	}
	st, _ := d.Connections(ctx)
	if len(st) != 1 || st[0].Cluster != "b" || st[0].State != cable.StateConnecting || len(st[0].Subnets) != 1 || st[0].Endpoint != "10.0.0.2:51820" {
		t.Errorf("status of the deferred peer: %+v", st)
	}
	stats := d.Stats()
	if err := d.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	advance(defaultDeferFor - time.Millisecond)
	if len(h.dev.Peers) != 0 || d.Stats() != stats {
		t.Fatalf("added before due, or a second Connect changed the host: %v", h.changes)
	}
	advance(time.Millisecond)
	if len(h.dev.Peers) != 1 || h.dev.Peers[0].PersistentKeepaliveInterval != DefaultKeepalive || d.HandshakeStats().DeferredAdds != 1 {
		t.Errorf("when due: peers %+v, stats %+v", h.dev.Peers, d.HandshakeStats())
	}
}

func TestDisconnectForgetsADeferredPeer(t *testing.T) {
	d, h, _, advance := handshakeDriver(t, KindKernel)
	ctx := context.Background()
	if err := d.Connect(ctx, remoteOfKind(remoteKey(t, d, false), KindKernel), nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Disconnect(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	advance(time.Second)
	if len(h.dev.Peers) != 0 || len(h.routes) != 0 || !d.watch.empty() {
		t.Errorf("after Disconnect of a deferred peer: peers %v routes %v", h.dev.Peers, h.routes)
	}
}

func TestAResponderReconnectingAfterARestartAddsThePeerAtOnce(t *testing.T) {
	d, h, _, _ := handshakeDriver(t, KindUserspace)
	ctx := context.Background()
	k := remoteKey(t, d, false)
	// An earlier run stored b; the fresh userspace device has no peers.
	if err := connections(d.dir).Save(map[string]storedConn{"b": {Node: "gw", PublicKey: k.String(), Subnets: pfx("10.2.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	d.stopWatcher()
	if err := d.Connect(ctx, remoteOfKind(k, KindUserspace), nil); err != nil {
		t.Fatal(err)
	}
	if len(h.dev.Peers) != 1 || h.dev.Peers[0].Endpoint == nil || h.dev.Peers[0].PersistentKeepaliveInterval != DefaultKeepalive {
		t.Errorf("reconnect after a restart: %+v, want the full configuration at once", h.dev.Peers)
	}
}

func TestCloseStopsTheHandshakeWatcher(t *testing.T) {
	d, _, _ := newFakeDriver(t, KindUserspace)
	d.timing = defaultHandshakeTiming()
	if err := d.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(context.Background(), remoteOfKind(testKey(t), KindUserspace), nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.watchStop != nil {
		t.Errorf("watcher still registered after Close")
	}
}

// restartedUserspace is a driver on a fresh userspace device (no peers, no routes, as after the
// process that held the previous one ended) over the state directory where an earlier run stored
// b: its key k, endpoint, subnets and device kind. d's watcher is stopped (the test steps it).
func restartedUserspace(t *testing.T, initiator bool, rec func(k wgtypes.Key) storedConn) (d *Driver, h *fakeHost, dev *fakeDevice, k wgtypes.Key) {
	t.Helper()
	d, h, dev, _ = handshakeDriver(t, KindUserspace)
	k = remoteKey(t, d, initiator)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := connections(d.dir).Save(map[string]storedConn{"b": rec(k)}); err != nil {
		t.Fatal(err)
	}
	h.changes = nil
	if err := d.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.stopWatcher()
	return d, h, dev, k
}

func fullRecord(k wgtypes.Key) storedConn {
	return storedConn{Node: "gw", PublicKey: k.String(), Endpoint: "10.0.0.2:51820", Subnets: pfx("10.2.0.0/16"), RemoteKind: KindUserspace}
}

func TestAUserspaceDeviceGetsThePreviousRunsPeerBackAtInit(t *testing.T) {
	d, h, _, k := restartedUserspace(t, false, fullRecord)
	if len(h.dev.Peers) != 1 {
		t.Fatalf("peers after Init: %+v, want b's restored", h.dev.Peers)
	}
	p := h.dev.Peers[0]
	if p.PublicKey != k || p.Endpoint == nil || p.Endpoint.String() != "10.0.0.2:51820" || p.PersistentKeepaliveInterval != DefaultKeepalive ||
		len(p.AllowedIPs) != 1 || p.AllowedIPs[0].String() != "10.2.0.0/16" {
		t.Errorf("restored peer %+v, want b's key, endpoint 10.0.0.2:51820, keepalive %v, allowed 10.2.0.0/16", p, DefaultKeepalive)
	}
	if len(h.routes) != 1 || h.routes[0].Dst != pfx("10.2.0.0/16")[0] {
		t.Errorf("routes after Init %+v, want 10.2.0.0/16 over the link", h.routes)
	}
	stored, err := connections(d.dir).Load()
	if err != nil || !storedEqual(stored["b"], fullRecord(k)) {
		t.Errorf("connections.json after Init: %+v %v, want b as it was", stored, err)
	}
	// The agent's first reconcile, asking for the same pair, finds it in place.
	h.changes = nil
	if err := d.Connect(context.Background(), remoteOfKind(k, KindUserspace), nil); err != nil {
		t.Fatal(err)
	}
	if len(h.changes) != 0 {
		t.Errorf("Connect of the restored pair changed %q, want nothing", h.changes)
	}
}

func TestARestoredPeerOfAnAssistedInitiatorIsNudged(t *testing.T) {
	d, h, _, k := restartedUserspace(t, true, fullRecord)
	d.mu.Lock()
	act := d.watch.step(d.now().Add(time.Second), h.dev.Peers)
	d.mu.Unlock()
	if len(act.Nudge) != 1 || act.Nudge[0] != k {
		t.Errorf("nudged %v a second after Init without a handshake, want b's key %v: the restored peer must get fresh initiations, not wait for WireGuard's own retry", act.Nudge, k)
	}
}

func TestARecordWithoutEndpointWaitsForTheFirstReconcile(t *testing.T) {
	// What an older agent stored: no endpoint, no device kind.
	d, h, _, k := restartedUserspace(t, false, func(k wgtypes.Key) storedConn {
		return storedConn{Node: "gw", PublicKey: k.String(), Subnets: pfx("10.2.0.0/16")}
	})
	if len(h.dev.Peers) != 0 || len(h.routes) != 0 {
		t.Errorf("Init restored %+v, routes %+v from a record without endpoint", h.dev.Peers, h.routes)
	}
	if err := d.Connect(context.Background(), remoteOfKind(k, KindUserspace), nil); err != nil {
		t.Fatal(err)
	}
	if len(h.dev.Peers) != 1 || h.dev.Peers[0].Endpoint == nil {
		t.Errorf("after the reconcile's Connect: %+v, want b's peer with its endpoint", h.dev.Peers)
	}
}
