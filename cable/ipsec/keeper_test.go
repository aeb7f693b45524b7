package ipsec

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestKeeperRetriesFastAfterALoadThenBacksOff(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	d.now = func() time.Time { return now }
	at := func(dt time.Duration) { now = start.Add(dt) }
	if err := d.Connect(ctx, testRemote(), nil); err != nil { // 10.0.0.1 < 10.0.0.2: we initiate
		t.Fatal(err)
	}
	initiates := func() int { return f.count("initiate") }

	// Right after the load charon's start_action is at work: no initiate of ours yet, and the
	// keeper wants to look again within firstInitRetry.
	if wait := d.keep(ctx); initiates() != 0 || wait > firstInitRetry {
		t.Fatalf("right after the load: %d initiates, next look in %s; want 0 and at most %s", initiates(), wait, firstInitRetry)
	}
	// The peer refused (no IKE_SA): initiate at firstInitRetry after the load, not at keepEvery.
	at(firstInitRetry)
	if wait := d.keep(ctx); initiates() != 1 || wait != firstInitRetry {
		t.Fatalf("%s after the load: %d initiates, next look in %s; want 1 and %s", firstInitRetry, initiates(), wait, firstInitRetry)
	}
	d.keep(ctx) // at once again: backing off
	if initiates() != 1 {
		t.Fatalf("%d initiates without waiting, want 1", initiates())
	}
	// Refused again: the next initiates come after 200ms, then 400ms (the wait doubles).
	at(2 * firstInitRetry)
	d.keep(ctx)
	at(2*firstInitRetry + 3*firstInitRetry) // 600ms after the second: the third's wait is 400ms
	d.keep(ctx)
	at(4*firstInitRetry + 4*firstInitRetry - time.Millisecond) // just before 800ms after the third
	d.keep(ctx)
	if initiates() != 3 {
		t.Fatalf("%d initiates, want 3 (200ms, 400ms, 800ms apart)", initiates())
	}

	// Charon is connecting (a silent peer it retransmits to): no initiate, a look again soon.
	f.sas["cbl-west"], f.saState = true, map[string]string{"cbl-west": "CONNECTING"}
	at(time.Hour)
	if wait := d.keep(ctx); initiates() != 3 || wait > keepEvery {
		t.Errorf("while CONNECTING: %d initiates, next look in %s", initiates(), wait)
	}
	// Established: the schedule resets; the keeper only looks every keepEvery.
	delete(f.saState, "cbl-west")
	if wait := d.keep(ctx); initiates() != 3 || wait != keepEvery {
		t.Errorf("while ESTABLISHED: %d initiates, next look in %s; want 3 and %s", initiates(), wait, keepEvery)
	}
	// A Connect that changes nothing keeps the schedule (no fresh load, no retry timer).
	if err := d.Connect(ctx, testRemote(), nil); err != nil {
		t.Fatal(err)
	}
	// The peer deletes the IKE_SA (its agent removes the connection, or restarts): no initiate
	// before lossGrace, then one, and the fast schedule again.
	delete(f.sas, "cbl-west")
	at(time.Hour + time.Second)
	if wait := d.keep(ctx); initiates() != 3 || wait != lossGrace {
		t.Fatalf("right after the peer's delete: %d initiates, next look in %s; want 3 and %s", initiates(), wait, lossGrace)
	}
	at(time.Hour + time.Second + lossGrace/2)
	d.keep(ctx)
	if initiates() != 3 {
		t.Fatalf("initiated %d times within lossGrace of the peer's delete, want 3", initiates())
	}
	at(time.Hour + time.Second + lossGrace)
	if wait := d.keep(ctx); initiates() != 4 || wait != firstInitRetry {
		t.Fatalf("lossGrace after the peer's delete: %d initiates, next look in %s; want 4 and %s", initiates(), wait, firstInitRetry)
	}
	// charon does not answer (it is being restarted): no initiate, and fewer looks.
	f.listErr = fmt.Errorf("vici list-sas: connection refused")
	at(2 * time.Hour)
	if wait := d.keep(ctx); initiates() != 4 || wait != keeperErrorWait {
		t.Errorf("while charon does not answer: %d initiates, next look in %s; want 4 and %s", initiates(), wait, keeperErrorWait)
	}
	f.listErr = nil
	// Our own agent removes it: the keeper forgets it and asks charon nothing.
	if err := d.Disconnect(ctx, "west"); err != nil {
		t.Fatal(err)
	}
	lists := f.count("list-sas")
	at(3 * time.Hour)
	if wait := d.keep(ctx); initiates() != 4 || f.count("list-sas") != lists || wait != keepEvery {
		t.Errorf("after Disconnect: %d initiates, %d list-sas, next look in %s", initiates(), f.count("list-sas")-lists, wait)
	}

	// The responder never initiates.
	other, g := newTestDriver(t, &logs)
	r := testRemote()
	r.Address = netip.MustParseAddr("10.0.0.0")
	if err := other.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	other.keep(ctx)
	other.now = func() time.Time { return time.Now().Add(time.Hour) }
	other.keep(ctx)
	if got := g.count("initiate"); got != 0 {
		t.Errorf("the responder initiated %d times", got)
	}
}

func TestInitiateBackoffSchedule(t *testing.T) {
	var got []time.Duration
	var total time.Duration
	b := time.Duration(0)
	for range 12 {
		b = nextInitBackoff(b)
		got = append(got, b)
		total += b
	}
	want := []time.Duration{
		200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond,
		3200 * time.Millisecond, 6400 * time.Millisecond, 12800 * time.Millisecond, 25600 * time.Millisecond,
		51200 * time.Millisecond, time.Minute, time.Minute, time.Minute,
	}
	if !slices.Equal(got, want) {
		t.Errorf("backoff schedule %v, want %v", got, want)
	}
	if got[0] < 100*time.Millisecond || got[0] > 250*time.Millisecond {
		t.Errorf("first retry after %s, want within 100-250ms of a refusal", got[0])
	}
	if nextInitBackoff(-time.Second) != firstInitRetry || nextInitBackoff(maxInitBackoff) != maxInitBackoff {
		t.Errorf("a negative wait or the cap: %s, %s", nextInitBackoff(-time.Second), nextInitBackoff(maxInitBackoff))
	}
}

func TestKeepActionDecidesFromTheSAs(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	established := []ikeSA{{State: "ESTABLISHED"}}
	connecting := []ikeSA{{State: "CONNECTING"}}
	tests := []struct {
		name         string
		conn         loadedConn
		sas          []ikeSA
		want         keepDecision
		wantUp       bool
		wantNext     time.Time
		wantBackoffs time.Duration
	}{
		{name: "an established IKE_SA resets the backoff and is looked at every keepEvery",
			conn: loadedConn{initBackoff: 8 * time.Second, nextInitiate: now.Add(time.Second)}, sas: established,
			want: keepDecision{after: keepEvery}, wantUp: true},
		{name: "a rekeying IKE_SA counts as established",
			conn: loadedConn{up: true}, sas: []ikeSA{{State: "REKEYING"}}, want: keepDecision{after: keepEvery}, wantUp: true},
		{name: "a connecting IKE_SA is left to charon and looked at again soon",
			conn: loadedConn{initBackoff: 400 * time.Millisecond}, sas: connecting,
			want: keepDecision{after: 400 * time.Millisecond}, wantBackoffs: 400 * time.Millisecond},
		{name: "a connecting IKE_SA after a long backoff is looked at within keepEvery",
			conn: loadedConn{initBackoff: maxInitBackoff}, sas: connecting,
			want: keepDecision{after: keepEvery}, wantBackoffs: maxInitBackoff},
		{name: "a connecting IKE_SA right after a load is looked at after firstInitRetry",
			conn: loadedConn{nextInitiate: now.Add(firstInitRetry)}, sas: connecting,
			want: keepDecision{after: firstInitRetry}, wantNext: now.Add(firstInitRetry)},
		{name: "an established IKE_SA that went waits lossGrace before initiating",
			conn: loadedConn{up: true}, want: keepDecision{after: lossGrace}, wantNext: now.Add(lossGrace)},
		{name: "no IKE_SA before the retry time waits for it",
			conn: loadedConn{nextInitiate: now.Add(150 * time.Millisecond), initBackoff: 400 * time.Millisecond},
			want: keepDecision{after: 150 * time.Millisecond}, wantNext: now.Add(150 * time.Millisecond), wantBackoffs: 400 * time.Millisecond},
		{name: "no IKE_SA at the retry time initiates, doubles the wait and looks at the outcome soon",
			conn: loadedConn{nextInitiate: now, initBackoff: 400 * time.Millisecond},
			want: keepDecision{initiate: true, after: firstInitRetry}, wantNext: now.Add(800 * time.Millisecond), wantBackoffs: 800 * time.Millisecond},
		{name: "a long backoff still looks at the outcome soon",
			conn: loadedConn{nextInitiate: now, initBackoff: maxInitBackoff},
			want: keepDecision{initiate: true, after: firstInitRetry}, wantNext: now.Add(maxInitBackoff), wantBackoffs: maxInitBackoff},
		{name: "no IKE_SA and no schedule (a fresh driver's first look) initiates at once",
			conn: loadedConn{}, want: keepDecision{initiate: true, after: firstInitRetry}, wantNext: now.Add(firstInitRetry), wantBackoffs: firstInitRetry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.conn
			got := keepAction(&c, tt.sas, now)
			if got != tt.want || c.up != tt.wantUp || !c.nextInitiate.Equal(tt.wantNext) || c.initBackoff != tt.wantBackoffs {
				t.Errorf("keepAction = %+v, conn up %v next %s backoff %s; want %+v, up %v next %s backoff %s",
					got, c.up, c.nextInitiate, c.initBackoff, tt.want, tt.wantUp, tt.wantNext, tt.wantBackoffs)
			}
		})
	}
}

// A charon restarted under a responder gets its connections back and initiates each at once,
// until an IKE_SA is up: the peer still holds one with the dead charon and would otherwise wait
// for its dead peer detection. Once up, the responder goes back to only responding.
func TestRestartedResponderInitiatesUntilUp(t *testing.T) {
	var logs bytes.Buffer
	d, f := newTestDriver(t, &logs)
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	d.now = func() time.Time { return now }
	r := testRemote()
	r.Address = netip.MustParseAddr("10.0.0.0") // 10.0.0.0 < 10.0.0.1: the peer initiates
	if err := d.Connect(ctx, r, nil); err != nil {
		t.Fatal(err)
	}
	d.keep(ctx)
	if got := f.count("initiate"); got != 0 {
		t.Fatalf("the responder initiated %d times before any restart", got)
	}

	// charon restarts: it lost every connection; the supervisor replays them.
	p := &charonProcess{}
	d.charon.Store(p)
	clear(f.conns)
	d.replay(ctx, p)
	if _, ok := f.conns["cbl-west"]; !ok {
		t.Fatalf("replay did not load the connection again; calls %v", f.calls)
	}
	if wait := d.keep(ctx); f.count("initiate") != 1 || wait > firstInitRetry {
		t.Fatalf("right after the replay: %d initiates, next look in %s; want 1 at once and a look within %s", f.count("initiate"), wait, firstInitRetry)
	}
	// The peer refused (it had not noticed yet): initiated again after the backoff.
	now = now.Add(firstInitRetry)
	d.keep(ctx)
	if got := f.count("initiate"); got != 2 {
		t.Fatalf("%d initiates %s after a refused one, want 2", got, firstInitRetry)
	}
	// Up: from now on the peer's role again; a lost IKE_SA is the peer's to restart.
	f.sas["cbl-west"] = true
	now = now.Add(time.Second)
	d.keep(ctx)
	delete(f.sas, "cbl-west")
	for range 3 {
		now = now.Add(time.Minute)
		d.keep(ctx)
	}
	if got := f.count("initiate"); got != 2 {
		t.Errorf("the responder initiated %d times after its IKE_SA was up and went, want still 2", got)
	}
	if !bytes.Contains(logs.Bytes(), []byte("up again after the charon restart")) {
		t.Errorf("no log line saying the connection is up again:\n%s", logs.String())
	}
}
