package ipsec

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

func TestDecideAdoption(t *testing.T) {
	const confPath = "/var/lib/cablemesh/ipsec/strongswan.conf"
	conf := []byte(renderConf(confParams{Port: 500, NATTPort: 4500, ViciSocket: "/var/lib/cablemesh/ipsec/charon.vici", MTU: 1438, MSS: 1398}))
	// adoptable is a charon every check passes for.
	adoptable := charonFound{PID: 4242, Running: true, Conf: confPath, SameExe: true, SameNetns: true, ConfOnDisk: conf}
	with := func(change func(*charonFound)) charonFound {
		f := adoptable
		change(&f)
		return f
	}
	otherConf := []byte(renderConf(confParams{Port: 500, NATTPort: 4500, ViciSocket: "/var/lib/cablemesh/ipsec/charon.vici", MTU: 1400, MSS: 1360, Libipsec: true}))
	tests := []struct {
		name      string
		found     charonFound
		adopt     bool
		stop      bool
		reasonHas string
	}{
		{"a running charon of ours with this run's configuration that answers is adopted", adoptable, true, false, "answers"},
		{"without a pid file a new charon starts", charonFound{}, false, false, "no charon pid file"},
		{"a dead pid starts a new charon", charonFound{PID: 4242}, false, false, "not running"},
		{"a pid now used by another process starts a new charon and leaves that process alone",
			charonFound{PID: 4242, Running: true, Conf: ""}, false, false, "not a charon of ours"},
		{"another node's charon (another state directory) is left alone",
			charonFound{PID: 4242, Running: true, Conf: "/var/lib/other/ipsec/strongswan.conf"}, false, false, "not a charon of ours"},
		{"a charon running another executable (an upgrade) is replaced", with(func(f *charonFound) { f.SameExe, f.SameNetns, f.ConfOnDisk = false, false, nil }), false, true, "another executable"},
		{"a charon in another network namespace is replaced", with(func(f *charonFound) { f.SameNetns, f.ConfOnDisk = false, nil }), false, true, "another network namespace"},
		{"a charon whose strongswan.conf is gone is replaced", with(func(f *charonFound) { f.ConfOnDisk = nil }), false, true, "strongswan.conf is gone"},
		{"a charon started with another configuration (datapath, MTU) is replaced", with(func(f *charonFound) { f.ConfOnDisk = otherConf }), false, true, "another strongswan.conf"},
		{"a charon whose configuration differs by one byte is replaced", with(func(f *charonFound) { f.ConfOnDisk = append(bytes.Clone(conf), '\n') }), false, true, "another strongswan.conf"},
		{"a charon whose vici socket is silent is replaced", with(func(f *charonFound) { f.Vici = errors.New("i/o timeout") }), false, true, "does not answer on its vici socket: i/o timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideAdoption(tt.found, confPath, conf)
			if got.Adopt != tt.adopt || got.Stop != tt.stop || !strings.Contains(got.Reason, tt.reasonHas) {
				t.Errorf("decideAdoption = %+v, want adopt %v stop %v, a reason containing %q", got, tt.adopt, tt.stop, tt.reasonHas)
			}
			if got.Adopt && got.Stop {
				t.Error("adopts and stops the same charon")
			}
		})
	}
}

func TestParseProcStat(t *testing.T) {
	// Field 2 may hold spaces and parentheses; the start time is field 22.
	line := "1302 (char on) x) S 1 1302 1302 0 -1 4194560 1530 0 0 0 12 7 0 0 20 0 17 0 98765 123456789 2000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n"
	st, err := parseProcStat([]byte(line))
	if err != nil || st.State != 'S' || st.Start != 98765 || !st.alive() {
		t.Errorf("parseProcStat = %+v, %v; want state S, start 98765, alive", st, err)
	}
	zombie := strings.Replace(line, ") S ", ") Z ", 1)
	if st, err := parseProcStat([]byte(zombie)); err != nil || st.alive() {
		t.Errorf("a zombie: %+v, %v; want not alive", st, err)
	}
	for _, bad := range []string{"", "1302 charon S 1", "1302 (charon) S 1 2 3", "1302 (charon) S 1 1302 1302 0 -1 4194560 1530 0 0 0 12 7 0 0 20 0 17 0 x 1"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestParsePIDFileAndEnviron(t *testing.T) {
	for in, want := range map[string]int{"1302\n": 1302, "1302": 1302, " 7 \n": 7, "": 0, "0\n": 0, "-5\n": 0, "12 13\n": 0, "pid\n": 0} {
		if got := parsePIDFile([]byte(in)); got != want {
			t.Errorf("parsePIDFile(%q) = %d, want %d", in, got, want)
		}
	}
	env := []byte("PATH=/usr/sbin:/usr/bin\x00STRONGSWAN_CONF=/s/ipsec/strongswan.conf\x00X=a=b\x00")
	if got := envValue(env, "STRONGSWAN_CONF"); got != "/s/ipsec/strongswan.conf" {
		t.Errorf("STRONGSWAN_CONF = %q", got)
	}
	if got := envValue(env, "X"); got != "a=b" {
		t.Errorf("X = %q", got)
	}
	if got := envValue(env, "STRONGSWAN"); got != "" {
		t.Errorf("a prefix of a key matched: %q", got)
	}
}

// TestConnectAfterAnAgentRestartChangesNothing: a driver with nothing in memory (a new agent
// process whose Init adopted the charon) Connects what the previous process loaded: charon is
// only read, no load-conn, no load-shared, no unload, no terminate, and the keeper does not
// initiate an established connection. The driver's record is rebuilt: Connections reports the
// connection as its own, connected.
func TestConnectAfterAnAgentRestartChangesNothing(t *testing.T) {
	var logs bytes.Buffer
	before, f := newTestDriver(t, &logs)
	ctx := context.Background()
	if err := before.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	f.sas["cbl-west"] = true

	// The next agent process: a new driver on the same charon.
	after, _ := newTestDriver(t, &logs)
	after.client = f
	calls := len(f.calls)
	if err := after.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	if st := after.Stats(); st != (Stats{}) {
		t.Errorf("Connect after the restart changed charon: %+v (calls %v)", st, f.calls[calls:])
	}
	for _, c := range f.calls[calls:] {
		if c != "list-conns" && c != "get-shared" {
			t.Errorf("Connect after the restart sent %s", c)
		}
	}
	if after.keep(ctx); f.count("initiate") != 0 {
		t.Errorf("the keeper initiated an established connection it took over")
	}
	conns, err := after.Connections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0].Cluster != "west" || conns[0].State != "connected" || conns[0].Endpoint != "10.0.0.2:500" {
		t.Errorf("Connections after the takeover: %+v", conns)
	}
	// And a second Connect is as idempotent as ever.
	if err := after.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	if st := after.Stats(); st != (Stats{}) {
		t.Errorf("the second Connect changed charon: %+v", st)
	}

	// The restarted agent brings a new key: taken down and loaded, the old key id unloaded.
	r := testRemote()
	r.PreSharedKey = []byte("a-rotated-key-of-32-bytes-exactly")
	third, _ := newTestDriver(t, &logs)
	third.client = f
	if err := third.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	if st := third.Stats(); st.SharedLoads != 1 || st.ConnLoads != 1 || st.Terminates != 1 || len(f.shared) != 1 {
		t.Errorf("a new key after the restart: %+v, charon holds %d keys", st, len(f.shared))
	}
}
