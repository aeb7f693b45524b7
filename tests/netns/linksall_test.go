package netns

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cablectl"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// linksAllReportInterval is the broker's --link-report-interval in TestLinksAll: a report is
// stale after three intervals and the rate limit (2s), 11s.
const linksAllReportInterval = 3 * time.Second

// TestLinksAll runs `cablectl links --all -o json` at the broker of a mesh of three clusters:
// the three pairs with both ends connected and agreeing. Then it cuts west's gateway off the
// underlay: east and north report their link to west down (error) at once (probe failures, 1s,
// then the next check and report, at most 2s each), while west cannot report: both of west's
// pairs must turn to not agree within 15s, and east-north stay agreed. Then, with west back, it
// stops north's agent (SIGSTOP): north's reports stop, and its pairs must turn stale within the
// stale bound (11s) and 10s more of slack.
func TestLinksAll(t *testing.T) {
	harness.RequireRoot(t)
	m := harness.New(t)
	m.StopBroker()
	m.BrokerArgs = []string{"--link-report-interval", linksAllReportInterval.String()}
	m.StartBroker()
	cs := m.AddClusters("east=10.1.0.0/16", "west=10.2.0.0/16", "north=10.3.0.0/16")
	west, north := cs[1], cs[2]
	m.WaitConnected(2*time.Minute, cs...)

	all := waitLinksAll(t, m, 60*time.Second, "three agreeing pairs", func(all cablectl.LinksAll) string {
		if len(all.Items) != 3 {
			return fmt.Sprintf("%d pairs, want 3", len(all.Items))
		}
		for _, p := range all.Items {
			if !p.Agree || p.Stale || len(p.Ends) != 2 {
				return fmt.Sprintf("pair %v agree=%v stale=%v with %d ends", p.Clusters, p.Agree, p.Stale, len(p.Ends))
			}
			for _, e := range p.Ends {
				if e.State != "connected" || e.Driver != "wireguard" || e.AgentVersion == "" || e.ReportedAt.IsZero() {
					return fmt.Sprintf("pair %v end %s: %+v, want connected over wireguard", p.Clusters, e.Cluster, e)
				}
			}
		}
		return ""
	})
	assertPairs(t, all, "east/north", "east/west", "north/west")
	m.Logf("links --all:\n%s", m.Cablectl("links", "--all").Stdout)

	port := underlayPort(west)
	if _, err := harness.MustRun(m.Ctx, "ip", "-n", m.UnderlayNS, "link", "set", port, "down"); err != nil {
		t.Fatal(err)
	}
	upAgain := func() { _, _ = harness.MustRun(m.Ctx, "ip", "-n", m.UnderlayNS, "link", "set", port, "up") }
	t.Cleanup(upAgain)
	cut := time.Now()
	waitLinksAll(t, m, 15*time.Second, "west's pairs down and not agreeing", func(all cablectl.LinksAll) string {
		for _, p := range all.Items {
			westPair := p.Clusters[0] == "west" || p.Clusters[1] == "west"
			if westPair && (p.Agree || allConnected(p)) {
				return fmt.Sprintf("pair %v still agree=%v, ends %s", p.Clusters, p.Agree, endStates(p))
			}
			if !westPair && !p.Agree {
				return fmt.Sprintf("pair %v, not west's, disagrees", p.Clusters)
			}
		}
		return ""
	})
	m.Logf("west cut off the underlay: its pairs disagree after %s:\n%s", time.Since(cut).Round(time.Millisecond), m.Cablectl("links", "--all").Stdout)
	upAgain()
	waitLinksAll(t, m, 60*time.Second, "three agreeing pairs again", func(all cablectl.LinksAll) string {
		for _, p := range all.Items {
			if !p.Agree || !allConnected(p) {
				return fmt.Sprintf("pair %v agree=%v, ends %s", p.Clusters, p.Agree, endStates(p))
			}
		}
		return ""
	})

	// SIGSTOP the agent's process group (ip netns exec runs the agent in its own group).
	pgid := north.Agent.Pid()
	if err := syscall.Kill(-pgid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop north's agent: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGCONT) })
	stopped := time.Now()
	waitLinksAll(t, m, 21*time.Second, "north's pairs stale", func(all cablectl.LinksAll) string {
		for _, p := range all.Items {
			northPair := p.Clusters[0] == "north" || p.Clusters[1] == "north"
			if northPair != p.Stale {
				return fmt.Sprintf("pair %v stale=%v", p.Clusters, p.Stale)
			}
		}
		return ""
	})
	m.Logf("north's agent stopped: its pairs stale after %s:\n%s", time.Since(stopped).Round(time.Millisecond), m.Cablectl("links", "--all").Stdout)
}

// waitLinksAll polls `cablectl links --all -o json` until bad says nothing is wrong ("").
func waitLinksAll(t *testing.T, m *harness.Mesh, within time.Duration, what string, bad func(cablectl.LinksAll) string) cablectl.LinksAll {
	t.Helper()
	var all cablectl.LinksAll
	var last harness.Result
	err := harness.WaitFor(within, 500*time.Millisecond, func() (bool, string) {
		last = m.Cablectl("links", "--all", "-o", "json")
		if last.Err != nil {
			return false, last.String()
		}
		all = cablectl.LinksAll{}
		if err := json.Unmarshal([]byte(last.Stdout), &all); err != nil {
			return false, fmt.Sprintf("not LinksAll JSON: %v: %q", err, last.Stdout)
		}
		msg := bad(all)
		return msg == "", msg
	})
	if err != nil {
		t.Fatalf("links --all: %s within %s: %v\nlast: %s", what, within, err, last.Stdout)
	}
	return all
}

func assertPairs(t *testing.T, all cablectl.LinksAll, want ...string) {
	t.Helper()
	var got []string
	for _, p := range all.Items {
		got = append(got, p.Clusters[0]+"/"+p.Clusters[1])
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("pairs %v, want %v", got, want)
	}
}

// allConnected: both clusters report the link (LinkPair.Alive is not in the JSON) connected.
func allConnected(p cablectl.LinkPair) bool {
	sides := map[string]bool{}
	for _, e := range p.Ends {
		if e.State != "connected" {
			return false
		}
		sides[e.Cluster] = true
	}
	return len(sides) == 2
}

func endStates(p cablectl.LinkPair) string {
	var s []string
	for _, e := range p.Ends {
		s = append(s, e.Cluster+"="+e.State)
	}
	return strings.Join(s, " ")
}
