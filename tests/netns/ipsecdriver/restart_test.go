package ipsecdriver

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/strongswan/govici/vici"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// Ping stream across the restart: pingCount echo requests pingInterval apart, 10s in all, of
// which at most maxLost may go unanswered.
const (
	pingCount    = 500
	pingInterval = "0.02"
	pingFor      = 10 * time.Second
	maxLost      = 1
)

// TestAgentRestartKeepsTheTunnel stops a's testpeer the way an agent stops (Close, not Cleanup)
// while a ping stream crosses the tunnel, and starts a new one, which Inits and Connects. The
// tunnel must not notice: charon is the same process (the new driver adopted it), the same
// IKE_SA and CHILD_SA (unique ids and SPIs, from list-sas) remain at both ends, the new driver's
// Connects change nothing in charon, and the stream loses at most one echo. Cleanup afterwards
// leaves no charon, no ipsec0, no pid file.
func TestAgentRestartKeepsTheTunnel(t *testing.T) {
	tmp, a, b := newPair(t)
	a.Start(t)
	b.Start(t)
	sts := map[*node]Status{}
	for _, n := range []*node{a, b} {
		sts[n] = waitStatus(t, n, "a connected connection", 60*time.Second, func(s Status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
	}
	nstest.PingOK(t, a.NS, b.pod)
	before := map[*node][]saIdentity{}
	for _, n := range []*node{a, b} {
		before[n] = listSAs(t, n, sts[n].ViciSocket)
		t.Logf("%s before the restart: %v", n.NS, before[n])
	}
	pid := sts[a].CharonPID

	ping := startPing(t, a.NS, b.pod)
	time.Sleep(time.Second)
	stopped := time.Now()
	a.Stop(t, syscall.SIGTERM)
	if p := readStatus(t, a).CloseProblem(); p != "" {
		t.Errorf("%s: %s", a.NS, p)
	}
	if !processRuns(pid) {
		t.Fatalf("charon %d stopped with its testpeer's Close", pid)
	}
	os.Remove(a.StatusPath)
	a.Start(t)
	st := waitStatus(t, a, "connected after the restart", 30*time.Second, func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	back := time.Now()
	t.Logf("a's testpeer stopped and started again, connected %s later; stats after its Connects %+v", back.Sub(stopped).Round(time.Millisecond), st.Stats)

	if st.CharonPID != pid {
		t.Errorf("charon pid %d after the restart, want the same %d", st.CharonPID, pid)
	}
	if st.Stats.CharonAdoptions != 1 || st.Stats.CharonStarts != 0 {
		t.Errorf("stats %+v: want charon adopted once, started never", st.Stats)
	}
	// The new process's two Connects found everything in place: not a word to charon but reads,
	// and no initiate by its keeper.
	changes := func(s ipsec.Stats) ipsec.Stats {
		return ipsec.Stats{ConnLoads: s.ConnLoads, SharedLoads: s.SharedLoads, Unloads: s.Unloads, Terminates: s.Terminates, Initiates: s.Initiates}
	}
	if changes(st.AfterFirstConnect) != (ipsec.Stats{}) || changes(st.AfterSecondConnect) != (ipsec.Stats{}) || changes(st.Stats) != (ipsec.Stats{}) {
		t.Errorf("the restarted driver changed charon: after its first Connect %+v, its second %+v, now %+v", st.AfterFirstConnect, st.AfterSecondConnect, st.Stats)
	}
	// The links the agent clamps the MSS on are the same for the adopted charon: ipsec0 (which
	// lives in charon) with libipsec, the underlay link with kernel ESP.
	if !slices.Equal(st.Links, sts[a].Links) || len(st.Links) != 1 {
		t.Errorf("links %v after the restart, %v before; want the same one link", st.Links, sts[a].Links)
	}
	if st.Datapath == string(ipsec.DatapathLibipsec) && !slices.Equal(st.Links, []string{"ipsec0"}) {
		t.Errorf("links %v with libipsec, want ipsec0", st.Links)
	}
	if c := st.Connections[0]; c.Endpoint != b.underlay+":500" {
		t.Errorf("endpoint %s, want the configured %s:500", c.Endpoint, b.underlay)
	}

	tx, rx, ended := ping.wait(t)
	if ended.Before(back) {
		t.Errorf("the ping stream ended %s before the tunnel was reported back: it did not span the restart", back.Sub(ended).Round(time.Millisecond))
	}
	t.Logf("ping stream across the restart: %d sent, %d answered", tx, rx)
	if tx < pingCount || tx-rx > maxLost {
		t.Errorf("ping stream across the restart: %d sent, %d answered; want %d sent and at most %d lost", tx, rx, pingCount, maxLost)
	}
	for _, n := range []*node{a, b} {
		after := listSAs(t, n, sts[n].ViciSocket)
		if !slices.Equal(after, before[n]) {
			t.Errorf("%s: the SAs changed across a's restart:\n before %v\n after  %v", n.NS, before[n], after)
		}
	}
	nstest.PingOK(t, b.NS, a.pod)

	for _, n := range []*node{a, b} {
		checkCleanedUp(t, n)
	}
	checkNoPSK(t, tmp)
}

// saIdentity names one IKE_SA with one of its CHILD_SAs: equal identities are the same SAs, not
// new ones negotiated in their place.
type saIdentity struct {
	IKE, IKEUniqueID, Child, ChildUniqueID, SPIIn, SPIOut, State string
}

func (s saIdentity) String() string {
	return fmt.Sprintf("%s#%s/%s#%s spi in %s out %s %s", s.IKE, s.IKEUniqueID, s.Child, s.ChildUniqueID, s.SPIIn, s.SPIOut, s.State)
}

// listSAs asks charon over its vici socket for its SAs.
func listSAs(t *testing.T, n *node, socket string) []saIdentity {
	t.Helper()
	s, err := vici.NewSession(vici.WithSocketPath(socket))
	if err != nil {
		t.Fatalf("%s: vici %s: %v", n.NS, socket, err)
	}
	defer s.Close()
	msgs, err := s.StreamedCommandRequest("list-sas", "list-sa", nil)
	if err != nil {
		t.Fatalf("%s: list-sas: %v", n.NS, err)
	}
	var out []saIdentity
	for _, m := range msgs {
		if m.Err() != nil {
			t.Fatalf("%s: list-sas: %v", n.NS, m.Err())
		}
		for _, ike := range m.Keys() {
			sa, ok := m.Get(ike).(*vici.Message)
			if !ok {
				continue
			}
			children, _ := sa.Get("child-sas").(*vici.Message)
			if children == nil {
				out = append(out, saIdentity{IKE: ike, IKEUniqueID: str(sa.Get("uniqueid")), State: str(sa.Get("state"))})
				continue
			}
			for _, name := range children.Keys() {
				c, _ := children.Get(name).(*vici.Message)
				if c == nil {
					continue
				}
				out = append(out, saIdentity{IKE: ike, IKEUniqueID: str(sa.Get("uniqueid")), Child: str(c.Get("name")), ChildUniqueID: str(c.Get("uniqueid")),
					SPIIn: str(c.Get("spi-in")), SPIOut: str(c.Get("spi-out")), State: str(sa.Get("state")) + "/" + str(c.Get("state"))})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	if len(out) == 0 {
		t.Fatalf("%s: charon holds no SA", n.NS)
	}
	return out
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// pingStream is a ping running in the background.
type pingStream struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

// startPing pings dst from ns pingCount times, pingInterval apart.
func startPing(t *testing.T, ns, dst string) *pingStream {
	t.Helper()
	p := &pingStream{done: make(chan error, 1)}
	p.cmd = exec.Command("ip", "netns", "exec", ns, "ping", "-n", "-q", "-i", pingInterval, "-c", strconv.Itoa(pingCount), "-W", "1", dst)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }() // owned by the ping process: ends when it does
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// wait waits for the ping to end and returns how many echo requests it sent and how many were
// answered, and when it ended.
func (p *pingStream) wait(t *testing.T) (tx, rx int, ended time.Time) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(pingFor + 30*time.Second):
		t.Fatalf("the ping stream did not end:\n%s", p.out.String())
	}
	p.done <- nil // for the cleanup
	ended = time.Now()
	m := pingSummary.FindStringSubmatch(p.out.String())
	if m == nil {
		t.Fatalf("no ping summary in:\n%s", p.out.String())
	}
	tx, _ = strconv.Atoi(m[1])
	rx, _ = strconv.Atoi(m[2])
	return tx, rx, ended
}
