package handover

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var west1 = Identity{Cluster: "west", Node: "gw1"}

func listen(t *testing.T, path string) *Offer {
	t.Helper()
	o, err := Listen(path, west1, "v-old", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return o
}

func TestHandsTheNodeOverOnceAndStopsListening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock.handover")
	o := listen(t, path)
	var released atomic.Int32
	stopped := make(chan struct{})
	var successor Successor
	go o.Serve(func(s Successor) {
		successor = s
		released.Add(1)
		<-stopped // the agent stops
	})
	// The reply must wait for the old agent to have stopped.
	time.AfterFunc(100*time.Millisecond, func() { close(stopped) })
	start := time.Now()
	took, err := Request(context.Background(), path, west1, "v-new")
	if err != nil || !took {
		t.Fatalf("Request = %v, %v; want handed over", took, err)
	}
	if d := time.Since(start); d < 90*time.Millisecond {
		t.Errorf("answered after %v, before the agent had stopped (100 ms)", d)
	}
	o.Wait()
	if n := released.Load(); n != 1 {
		t.Errorf("release called %d times, want 1", n)
	}
	// Both ends are this test's process: one PID namespace, so the running agent may leave its
	// helper daemons for the successor to adopt.
	if successor.Version != "v-new" || successor.PIDNamespace == "" || !successor.SharesPIDNamespace() {
		t.Errorf("successor %+v (own PID namespace %q): want v-new in this PID namespace", successor, PIDNamespace())
	}
	if (Successor{PIDNamespace: "pid:[1]"}).SharesPIDNamespace() || (Successor{}).SharesPIDNamespace() {
		t.Errorf("a successor in another or an unknown PID namespace counted as sharing this one")
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file still there after the hand-over: %v", err)
	}
	// A second successor finds nobody: the node is no longer this agent's to give.
	if took, err := Request(context.Background(), path, west1, "v-newer"); took || err != nil {
		t.Errorf("second Request = %v, %v; want nobody serving", took, err)
	}
}

func TestRefusesAnotherNodesAgent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock.handover")
	o := listen(t, path)
	var released atomic.Int32
	go o.Serve(func(Successor) { released.Add(1) })
	for _, id := range []Identity{{Cluster: "west", Node: "gw2"}, {Cluster: "east", Node: "gw1"}} {
		took, err := Request(context.Background(), path, id, "v-new")
		if took || err == nil || !strings.Contains(err.Error(), `refused`) || !strings.Contains(err.Error(), id.Cluster) || !strings.Contains(err.Error(), id.Node) {
			t.Errorf("Request for %+v = %v, %v; want a refusal naming it", id, took, err)
		}
	}
	if n := released.Load(); n != 0 {
		t.Fatalf("released for another node's agent (%d times)", n)
	}
	// Still offered to the right one.
	if took, err := Request(context.Background(), path, west1, "v-new"); !took || err != nil {
		t.Errorf("Request after refusals = %v, %v; want handed over", took, err)
	}
}

func TestNobodyToTakeOverFrom(t *testing.T) {
	dir := t.TempDir()
	if took, err := Request(context.Background(), filepath.Join(dir, "none"), west1, "v"); took || err != nil {
		t.Errorf("no socket: Request = %v, %v; want false, nil", took, err)
	}
	// A dead agent's socket file: nobody accepts on it.
	stale := filepath.Join(dir, "stale")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if took, err := Request(context.Background(), stale, west1, "v"); took || err != nil {
		t.Errorf("stale socket: Request = %v, %v; want false, nil", took, err)
	}
	// And Listen replaces it.
	listen(t, stale)
}

func TestListenRefusesALiveAgentsSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock.handover")
	o := listen(t, path)
	go o.Serve(func(Successor) {})
	if _, err := Listen(path, west1, "v", slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "another process is serving") {
		t.Errorf("Listen on a live socket: %v; want refused", err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(filepath.Dir(path), "file"), west1, "v", slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen on a regular file: %v; want refused", err)
	}
}

func TestAStuckPredecessorIsAnErrorAfterTheDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock.handover")
	o := listen(t, path)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	go o.Serve(func(Successor) { <-stuck })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	took, err := Request(ctx, path, west1, "v")
	if took || err == nil || !strings.Contains(err.Error(), "did not stop in time") {
		t.Errorf("Request = %v, %v; want a timeout error", took, err)
	}
}

func TestGarbageIsRefusedAndTheOfferStays(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock.handover")
	o := listen(t, path)
	go o.Serve(func(Successor) {})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("{not json\n"))
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	c.Close()
	if r, err := parseReply(buf[:n]); err != nil || r.Released || !strings.Contains(r.Error, "hand-over request") {
		t.Errorf("reply to garbage %q (%v); want a refusal", buf[:n], err)
	}
	if took, err := Request(context.Background(), path, west1, "v"); !took || err != nil {
		t.Errorf("Request after garbage = %v, %v; want handed over", took, err)
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"cluster":"west","node":"gw1","version":"v1"}`))
	f.Add([]byte(`{"cluster":"west"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte("\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRequest(b, west1)
		if err == nil && r.Identity != west1 {
			t.Fatalf("accepted %q as %+v, not %+v", b, r.Identity, west1)
		}
		if rep, err := parseReply(b); err == nil && !rep.Released && rep.Error == "" {
			t.Fatalf("reply %q accepted with neither released nor an error", b)
		}
	})
}

// A stopped (SIGSTOP) agent's socket accepts connections in the kernel and never answers: the
// successor goes on after AckTimeout, not after the whole deadline.
func TestAProcessThatNeverAnswersIsPassedAfterAckTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock.handover")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close() // never accepted
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	took, err := Request(ctx, path, west1, "v")
	d := time.Since(start)
	if took || err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("Request = %v, %v; want an error saying the process did not answer", took, err)
	}
	if d < AckTimeout || d > AckTimeout+2*time.Second {
		t.Errorf("gave up after %v, want about %v", d, AckTimeout)
	}
}
