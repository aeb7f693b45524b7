package ipsec

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// fakeCharon answers the VICI commands the driver uses from an in-memory configuration, as
// charon 5.9 would, and records every request.
type fakeCharon struct {
	mu     sync.Mutex
	conns  map[string]map[string]any // name -> load-conn section
	shared map[string]string         // id -> data
	sas    map[string]bool           // conn names with an IKE_SA
	// saState is the state list-sas reports for an IKE_SA of sas (ESTABLISHED when unset).
	saState map[string]string
	// listErr, when set, is list-sas's answer (charon down).
	listErr error
	// deleteUnanswered makes terminate answer as charon does when the peer never answers the
	// DELETE within the timeout: an error, the SA destroyed by force all the same.
	deleteUnanswered bool
	// terminateTimeouts are the timeouts terminate was asked for, in order.
	terminateTimeouts []string
	calls             []string
	secrets           []string // every "data" value that crossed, to prove where the key went
}

func newFakeCharon() *fakeCharon {
	return &fakeCharon{conns: map[string]map[string]any{}, shared: map[string]string{}, sas: map[string]bool{}}
}

func (f *fakeCharon) call(_ context.Context, cmd string, msg map[string]any) (map[string]any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, cmd)
	if _, err := toMessage(msg); err != nil {
		return nil, fmt.Errorf("fake vici %s: message does not encode: %w", cmd, err)
	}
	switch cmd {
	case "version":
		return map[string]any{"daemon": "charon", "version": "5.9.8"}, nil
	case "load-conn":
		for name, sec := range msg {
			f.conns[name] = sec.(map[string]any)
		}
	case "unload-conn":
		delete(f.conns, msg["name"].(string))
	case "load-shared":
		f.shared[msg["id"].(string)] = msg["data"].(string)
		f.secrets = append(f.secrets, msg["data"].(string))
	case "unload-shared":
		delete(f.shared, msg["id"].(string))
	case "get-shared":
		var ids []string
		for id := range f.shared {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return map[string]any{"keys": ids}, nil
	default:
		return nil, fmt.Errorf("fake vici: unexpected command %s", cmd)
	}
	return map[string]any{"success": "yes"}, nil
}

func (f *fakeCharon) stream(_ context.Context, cmd, event string, msg map[string]any) ([]map[string]any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, cmd)
	ike, _ := msg["ike"].(string)
	switch cmd {
	case "list-conns":
		var out []map[string]any
		for name, sec := range f.conns {
			if ike != "" && ike != name {
				continue
			}
			// Reported as list-conns does: "local-ts"/"remote-ts" in the children.
			children := map[string]any{}
			for cn, c := range sec["children"].(map[string]any) {
				c := c.(map[string]any)
				children[cn] = map[string]any{"mode": "TUNNEL", "local-ts": c["local_ts"], "remote-ts": c["remote_ts"]}
			}
			out = append(out, map[string]any{name: map[string]any{
				"local_addrs": sec["local_addrs"], "remote_addrs": sec["remote_addrs"], "version": "IKEv2", "children": children,
			}})
		}
		return out, nil
	case "list-sas":
		if f.listErr != nil {
			return nil, f.listErr
		}
		var out []map[string]any
		for name := range f.sas {
			if ike == "" || ike == name {
				state := "ESTABLISHED"
				if st, ok := f.saState[name]; ok {
					state = st
				}
				out = append(out, saEvent(name, state, "3", map[string]any{"c": child("INSTALLED", "1", "1")}))
			}
		}
		return out, nil
	case "terminate":
		delete(f.sas, ike)
		f.terminateTimeouts = append(f.terminateTimeouts, fmt.Sprint(msg["timeout"]))
		if f.deleteUnanswered {
			return nil, fmt.Errorf("vici: command failed: terminating SA failed")
		}
		return nil, nil
	case "initiate":
		return nil, nil
	}
	return nil, fmt.Errorf("fake vici: unexpected streamed command %s", cmd)
}

func (f *fakeCharon) count(cmd string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == cmd {
			n++
		}
	}
	return n
}

// newTestDriver builds an initialised driver on the fake, logging into buf.
func newTestDriver(t *testing.T, buf *bytes.Buffer) (*Driver, *fakeCharon) {
	t.Helper()
	node := testLocal
	node.StateDir = t.TempDir()
	node.Log = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := NewDriver(node, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeCharon()
	d.client, d.initialised, d.libipsec, d.mtu = f, true, true, LibipsecMTU
	return d, f
}

func TestConnectIsIdempotentAndReadsBeforeWriting(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	remote := testRemote()

	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}
	first := d.Stats()
	if first.ConnLoads != 1 || first.SharedLoads != 1 {
		t.Fatalf("first Connect: %+v, want one load-conn and one load-shared", first)
	}
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}
	if d.Stats() != first {
		t.Errorf("second Connect changed charon: %+v then %+v", first, d.Stats())
	}
	if f.count("list-conns") < 2 || f.count("get-shared") < 2 {
		t.Errorf("Connect did not read charon's state first: calls %v", f.calls)
	}

	// Charon lost the connection behind our back (restart): Connect loads it again.
	delete(f.conns, "cbl-west")
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}
	if got := d.Stats().ConnLoads; got != 2 {
		t.Errorf("load-conn count %d after charon lost the connection, want 2", got)
	}

	// New subnets: the established SA is taken down and the connection loaded afresh.
	f.sas["cbl-west"] = true
	remote.Subnets = []netip.Prefix{netip.MustParsePrefix("10.4.0.0/16")}
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}
	st := d.Stats()
	if st.ConnLoads != 3 || st.Terminates != 1 || f.sas["cbl-west"] {
		t.Errorf("after a subnet change: %+v, SA still there: %v", st, f.sas["cbl-west"])
	}
	if got := f.conns["cbl-west"]["children"].(map[string]any)["cbl-west"].(map[string]any)["remote_ts"]; !slices.Equal(got.([]string), []string{"10.4.0.0/16"}) {
		t.Errorf("remote_ts in charon %v", got)
	}

	// A new key is loaded, and the SA re-authenticates with it.
	f.sas["cbl-west"] = true
	remote.PreSharedKey = []byte("another-key-of-32-bytes-exactly!")
	if err := d.Connect(ctx, remote, nil); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); st.SharedLoads != 3 || st.Terminates != 2 || len(f.shared) != 1 || f.shared[d.conns["cbl-west"].keyID] != string(remote.PreSharedKey) {
		t.Errorf("after a key change: %+v, charon holds %d keys", st, len(f.shared))
	}

	// Disconnect removes connection, SA and key; a second Disconnect and an unknown cluster
	// change nothing.
	if err := d.Disconnect(ctx, "west"); err != nil {
		t.Fatal(err)
	}
	if len(f.conns) != 0 || len(f.shared) != 0 || len(f.sas) != 0 {
		t.Errorf("after Disconnect charon holds conns %v keys %d SAs %v", f.conns, len(f.shared), f.sas)
	}
	after := d.Stats()
	if err := d.Disconnect(ctx, "west"); err != nil {
		t.Fatal(err)
	}
	if err := d.Disconnect(ctx, "nowhere"); err != nil {
		t.Fatal(err)
	}
	if d.Stats() != after {
		t.Errorf("Disconnect of nothing changed charon: %+v then %+v", after, d.Stats())
	}
}

func TestConnectRefusesBadInputBeforeTouchingCharon(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		remote  cable.RemoteEndpoint
		opts    cable.Options
		wantErr string
	}{
		"an unknown option":       {testRemote(), cable.Options{"vni": "1"}, `ipsec option vni="1": unknown key`},
		"encap off with libipsec": {testRemote(), cable.Options{"encap": "false"}, "option encap=false: kernel-libipsec sends ESP only in UDP"},
		"an empty key":            {func() cable.RemoteEndpoint { r := testRemote(); r.PreSharedKey = nil; return r }(), nil, "pre-shared key has 0 bytes"},
		"subnets of another connection": {func() cable.RemoteEndpoint {
			r := testRemote()
			r.Cluster = "north"
			r.Address = netip.MustParseAddr("10.0.0.9")
			return r
		}(), nil, "overlaps 10.2.0.0/16 of cluster west"},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "subnets of another connection" {
				if err := d.Connect(ctx, testRemote(), nil); err != nil {
					t.Fatal(err)
				}
			}
			before := d.Stats()
			calls := len(f.calls)
			err := d.Connect(ctx, tc.remote, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
			if d.Stats() != before || len(f.calls) != calls {
				t.Errorf("refused Connect talked to charon: %v", f.calls[calls:])
			}
		})
	}
}

// TestThePreSharedKeyGoesOnlyToCharon: the key crosses VICI in load-shared and nowhere else: not
// in the logs (every level), not in errors, not in any file under the state directory.
func TestThePreSharedKeyGoesOnlyToCharon(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	key := []byte("key-that-must-only-reach-charon-0123456789")
	remote := testRemote()
	remote.PreSharedKey = key

	// Files the driver writes: strongswan.conf (rendered the way Init writes it).
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := renderConf(confParams{Port: 500, NATTPort: 4500, ViciSocket: filepath.Join(d.dir, socketFile), Libipsec: true, MTU: 1400, MSS: 1360})
	if err := writeFileAtomic(filepath.Join(d.dir, confFile), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var errs []string
	for _, step := range []func() error{
		func() error { return d.Connect(ctx, remote, nil) },
		func() error { return d.Connect(ctx, remote, nil) },
		func() error { r := remote; r.Port = 4501; return d.Connect(ctx, r, nil) },
		func() error { r := remote; r.Address = netip.Addr{}; return d.Connect(ctx, r, nil) }, // an error path
		func() error { _, err := d.Connections(ctx); return err },
		func() error { return d.Disconnect(ctx, "west") },
		func() error { return d.Connect(ctx, remote, nil) },
	} {
		if err := step(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) != 1 {
		t.Errorf("errors %v, want exactly the one of the invalid address", errs)
	}
	if len(f.secrets) == 0 || f.secrets[0] != string(key) {
		t.Fatalf("the key never reached charon through load-shared")
	}
	if logs.Len() == 0 {
		t.Fatal("the driver logged nothing: the log check proves nothing")
	}
	forms := [][]byte{key, []byte(hex.EncodeToString(key)), []byte(base64.StdEncoding.EncodeToString(key)), key[:12]}
	check := func(where string, data []byte) {
		for _, form := range forms {
			if bytes.Contains(data, form) {
				t.Errorf("%s contains the key (form %q)", where, form)
			}
		}
	}
	check("the log", logs.Bytes())
	check("the errors", []byte(strings.Join(errs, "\n")))
	files := 0
	err := filepath.WalkDir(d.node.StateDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		check(path, data)
		info, err := e.Info()
		if err == nil && info.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", path, info.Mode().Perm())
		}
		return nil
	})
	if err != nil || files == 0 {
		t.Errorf("walk the state directory: %v, %d files", err, files)
	}
	if info, err := os.Stat(d.dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, mode %v, want 0700", d.dir, err, info.Mode().Perm())
	}
}

func TestCleanupRemovesEverythingOfOursFromCharon(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	if err := d.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	f.sas["cbl-west"] = true
	// Left by an earlier run, and someone else's.
	f.conns["cbl-stale"] = map[string]any{"local_addrs": []string{"10.0.0.1"}, "remote_addrs": []string{"10.0.0.7"}, "children": map[string]any{}}
	f.shared["cbl-stale"] = "x"
	f.conns["other"] = map[string]any{"local_addrs": []string{"10.0.0.1"}, "remote_addrs": []string{"10.0.0.8"}, "children": map[string]any{}}
	// Cleanup of a system charon: only our things go, charon and the host are left alone.
	d.cfg.SystemVICI = "/nonexistent/charon.vici"
	if err := d.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.conns["other"]; !ok || len(f.conns) != 1 || len(f.shared) != 0 || len(f.sas) != 0 {
		t.Errorf("after Cleanup charon holds conns %v, keys %v, SAs %v; want only the foreign connection", f.conns, f.shared, f.sas)
	}
}

func TestConnectAdoptsAnIdenticalConnectionWithoutTakingItsSADown(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	want, err := desiredFromRemote(d.node, testRemote(), defaultOpts(t))
	if err != nil {
		t.Fatal(err)
	}
	// What an earlier agent process left in a system charon.
	for name, sec := range connMessage(want) {
		f.conns[name] = sec.(map[string]any)
	}
	f.sas["cbl-west"] = true
	if err := d.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	if st := d.Stats(); st.Terminates != 0 || st.Unloads != 0 || !f.sas["cbl-west"] {
		t.Errorf("adopting an identical connection took it down: %+v, SA there: %v", st, f.sas["cbl-west"])
	}
}
