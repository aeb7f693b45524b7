package ipsec

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// newSystemDriver builds a driver for a system charon that is the fake, not yet initialised.
func newSystemDriver(t *testing.T) (*Driver, *fakeCharon) {
	t.Helper()
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	d.client, d.initialised = nil, false
	d.cfg = config{SystemVICI: "/nonexistent/charon.vici"}
	d.dial = func(string) viciClient { return f }
	return d, f
}

func TestCallsBeforeInitOrAfterCloseAreNotInitialised(t *testing.T) {
	d, f := newSystemDriver(t)
	ctx := context.Background()
	check := func(when string) {
		t.Helper()
		if err := d.Connect(ctx, testRemote(), nil); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Connect %s: %v, want ErrNotInitialised", when, err)
		}
		if err := d.Disconnect(ctx, "west"); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Disconnect %s: %v, want ErrNotInitialised", when, err)
		}
		if _, err := d.Connections(ctx); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Connections %s: %v, want ErrNotInitialised", when, err)
		}
	}
	check("before Init")
	if len(f.calls) != 0 {
		t.Errorf("calls before Init reached charon: %v", f.calls)
	}
	if err := d.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	check("after Close")
}

// TestCloseAndCleanupStopEveryGoroutine: after Close (and after Cleanup) no goroutine the driver
// started (the keeper) is left, even while it was busy initiating.
func TestCloseAndCleanupStopEveryGoroutine(t *testing.T) {
	for _, stop := range []string{"Close", "Cleanup"} {
		t.Run(stop, func(t *testing.T) {
			d, f := newSystemDriver(t)
			ctx := context.Background()
			if err := d.Init(ctx); err != nil {
				t.Fatal(err)
			}
			// 10.0.0.1 < 10.0.0.2: this node initiates, so the keeper is kicked and works.
			if err := d.Connect(ctx, testRemote(), nil); err != nil {
				t.Fatal(err)
			}
			if len(driverGoroutines()) == 0 {
				t.Fatal("Init started no goroutine: the test proves nothing")
			}
			waitFor(t, "the keeper to initiate", func() bool { return f.count("initiate") > 0 })
			var err error
			if stop == "Close" {
				err = d.Close()
			} else {
				err = d.Cleanup(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if left = driverGoroutines(); len(left) == 0 {
					break
				}
			}
			if len(left) > 0 {
				t.Errorf("%d goroutines of the driver left after %s:\n%s", len(left), stop, strings.Join(left, "\n\n"))
			}
			// Stopped for good: nothing talks to charon any more.
			calls := f.count("list-sas")
			time.Sleep(2 * keepEvery)
			if f.count("list-sas") != calls {
				t.Errorf("charon was asked for SAs after %s", stop)
			}
		})
	}
}

// driverGoroutines are the stacks of the goroutines running this package's code, but the
// calling one.
func driverGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i > 0 && strings.Contains(g, "cablemesh/cable/ipsec.") && !strings.Contains(g, "testing.tRunner") {
			out = append(out, g)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestPlanConn(t *testing.T) {
	want, err := desiredFromRemote(testLocal, testRemote(), defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	msg := connMessage(want)
	fp := fingerprint(msg)
	id := keyID(want.Name, fp, testKey)
	oldKeyID := keyID(want.Name, fp, []byte("the-key-before-this-one-0123456"))
	oldConnID := keyID(want.Name, "fingerprint of another configuration", testKey)
	loaded := map[string]any{}
	for _, ev := range mustList(t, msg) {
		loaded = ev
	}
	other := want
	other.RemoteTS = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
	changed := map[string]any{}
	for _, ev := range mustList(t, connMessage(other)) {
		changed = ev
	}
	tests := []struct {
		name   string
		loaded map[string]any
		ids    []string
		old    *loadedConn
		want   connPlan
	}{
		{"everything in place needs nothing", loaded, []string{id}, &loadedConn{keyID: id}, connPlan{}},
		{"everything in place after an agent restart (adopted charon, nothing in memory) needs nothing", loaded, []string{id}, nil, connPlan{}},
		{"a first Connect loads key and connection", nil, nil, nil, connPlan{loadKey: true, loadConn: true}},
		{"a connection charon lost is loaded again", nil, []string{id}, &loadedConn{keyID: id}, connPlan{loadConn: true}},
		{"a connection charon lost is loaded again after an agent restart", nil, []string{id}, nil, connPlan{loadConn: true}},
		{"a key charon lost is loaded again alone", loaded, nil, &loadedConn{keyID: id}, connPlan{loadKey: true}},
		{"a new key takes the connection down and loads both", loaded, []string{oldKeyID}, &loadedConn{keyID: oldKeyID},
			connPlan{loadKey: true, loadConn: true, takeDown: true, unloadKeys: []string{oldKeyID}}},
		{"a new key found after an agent restart takes the connection down and loads both", loaded, []string{oldKeyID}, nil,
			connPlan{loadKey: true, loadConn: true, takeDown: true, unloadKeys: []string{oldKeyID}}},
		{"a configuration change list-conns cannot show (proposals) found after an agent restart is loaded afresh", loaded, []string{oldConnID}, nil,
			connPlan{loadKey: true, loadConn: true, takeDown: true, unloadKeys: []string{oldConnID}}},
		{"changed subnets are taken down and loaded", changed, []string{oldConnID}, &loadedConn{keyID: oldConnID},
			connPlan{loadKey: true, loadConn: true, takeDown: true, unloadKeys: []string{oldConnID}}},
		{"a connection changed behind our back under our key id is taken down and loaded", changed, []string{id}, nil,
			connPlan{loadConn: true, takeDown: true}},
		{"an identical connection another process loaded is loaded on top", loaded, nil, nil, connPlan{loadKey: true, loadConn: true}},
		{"a key an older driver loaded under the bare name is replaced, the connection loaded on top", loaded, []string{want.Name}, nil,
			connPlan{loadKey: true, loadConn: true, unloadKeys: []string{want.Name}}},
		{"a stale key id beside the wanted one is unloaded alone", loaded, []string{oldKeyID, id}, nil, connPlan{unloadKeys: []string{oldKeyID}}},
		{"key ids of other connections are left alone", loaded, []string{id, "cbl-westside#00", "cbl-wes#11"}, nil, connPlan{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := planConn(tt.loaded, tt.ids, tt.old, want, id); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("planConn = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestKeyIDBindsTheKeyAndTheConfiguration(t *testing.T) {
	fp := fingerprint(connMessage(mustDesired(t)))
	id := keyID("cbl-west", fp, testKey)
	if connOfKeyID(id) != "cbl-west" || !strings.HasPrefix(id, "cbl-west#") || len(id) != len("cbl-west#")+24 {
		t.Errorf("key id %q, want cbl-west#<24 hex digits>", id)
	}
	if keyID("cbl-west", fp, testKey) != id {
		t.Error("the key id is not stable")
	}
	if keyID("cbl-west", fp, []byte("another-key-0123456789abcdef")) == id {
		t.Error("another key gives the same key id")
	}
	if keyID("cbl-west", "another fingerprint", testKey) == id {
		t.Error("another configuration gives the same key id")
	}
	if strings.Contains(id, hex.EncodeToString(testKey)[:8]) || strings.Contains(id, string(testKey[:4])) {
		t.Errorf("key id %q shows the key", id)
	}
	if connOfKeyID("cbl-west") != "cbl-west" || connOfKeyID("cbl-a.b#x") != "cbl-a.b" {
		t.Error("connOfKeyID")
	}
}

func mustDesired(t *testing.T) desiredConn {
	t.Helper()
	want, err := desiredFromRemote(testLocal, testRemote(), defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// mustList is what list-conns reports for the load-conn message msg (as the fake charon does).
func mustList(t *testing.T, msg map[string]any) []map[string]any {
	t.Helper()
	f := newFakeCharon()
	if _, err := f.call(context.Background(), "load-conn", msg); err != nil {
		t.Fatal(err)
	}
	evs, err := f.stream(context.Background(), "list-conns", "list-conn", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, ev := range evs {
		for _, sec := range ev {
			out = append(out, sec.(map[string]any))
		}
	}
	return out
}
