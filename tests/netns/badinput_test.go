package netns

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestBadInput checks that an expired token, a forged token, an overlapping pod CIDR and a
// malformed agent config each fail with a message that says what is wrong, and change nothing.
func TestBadInput(t *testing.T) {
	m := harness.New(t)
	clusters := m.AddClusters("east=10.1.0.0/16", "west=10.2.0.0/16")
	m.WaitConnected(ConnectTimeout, clusters...)
	namesBefore := clusterNames(t, m)
	statusBefore := map[string]int{}
	for _, c := range clusters {
		st, err := c.Status()
		if err != nil {
			t.Fatalf("status of %s: %v", c.Name, err)
		}
		statusBefore[c.Name] = len(st.Connections)
	}

	// nothingJoined checks the existing agents still see only each other and the new gateway
	// has no cable link and no certificate.
	nothingJoined := func(t *testing.T, c *harness.Cluster) {
		t.Helper()
		for _, o := range clusters {
			st, err := o.Status()
			if err != nil {
				t.Errorf("status of %s: %v", o.Name, err)
				continue
			}
			if _, ok := harness.Connection(st, c.Name); ok || len(st.Connections) != statusBefore[o.Name] {
				t.Errorf("%s now has %d connections (had %d), including %s: %v", o.Name, len(st.Connections), statusBefore[o.Name], c.Name, ok)
			}
		}
		for _, cv := range clusterList(t, m) {
			if cv.Name == c.Name && len(cv.Gateways) > 0 {
				t.Errorf("the broker lists gateways %+v for %s", cv.Gateways, c.Name)
			}
		}
		if _, err := os.Stat(filepath.Join(c.StateDir, "agent.crt")); err == nil {
			t.Errorf("the failed agent holds a certificate in %s", c.StateDir)
		}
		for _, l := range m.Links(c.GwNS) {
			if strings.HasPrefix(l, "cbl-") {
				t.Errorf("the failed agent left link %s in %s", l, c.GwNS)
			}
		}
	}

	// agentFails starts c's agent and waits for it to exit non-zero, or, for an agent that keeps
	// retrying, for its log to say want. It returns the log.
	agentFails := func(t *testing.T, c *harness.Cluster, want ...string) string {
		t.Helper()
		c.StartAgent()
		var log string
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			log = c.Agent.Log()
			exited, _ := c.Agent.Exited()
			return exited || containsAll(log, want...), "agent still running, log lacks " + strings.Join(want, ", ")
		})
		if err != nil {
			t.Errorf("agent %s: %v\n%s", c.Name, err, log)
		}
		// An agent that gave up must say so with its exit code; one that keeps retrying is
		// stopped here.
		if exited, code := c.Agent.Exited(); exited && code == 0 {
			t.Errorf("agent %s exited 0, want a failure", c.Name)
		} else if exited {
			t.Logf("agent %s exited with code %d", c.Name, code)
		} else {
			t.Logf("agent %s keeps retrying; stopping it", c.Name)
			c.StopAgent()
		}
		if !containsAll(strings.ToLower(c.Agent.Log()), want...) {
			t.Errorf("agent %s log does not say %q:\n%s", c.Name, want, c.Agent.Log())
		}
		return c.Agent.Log()
	}

	t.Run("an expired join token is refused", func(t *testing.T) {
		c := m.NewCluster("late", "10.5.0.0/16")
		r := m.JoinToken(c.Name, "10.5.0.0/16", "--valid-for", "1s")
		if r.Err != nil {
			t.Fatalf("join-token --valid-for 1s: %s", r)
		}
		c.WriteToken(strings.TrimSpace(r.Stdout))
		c.WriteConfig("")
		time.Sleep(2 * time.Second)
		agentFails(t, c, "expired")
		nothingJoined(t, c)
	})

	t.Run("a forged join token is refused", func(t *testing.T) {
		c := m.NewCluster("fake", "10.6.0.0/16")
		r := m.JoinToken(c.Name, "10.6.0.0/16")
		if r.Err != nil {
			t.Fatalf("join-token: %s", r)
		}
		c.WriteToken(forge(t, strings.TrimSpace(r.Stdout)))
		c.WriteConfig("")
		agentFails(t, c, "token", "signature")
		nothingJoined(t, c)
	})

	t.Run("a cluster whose pod CIDR overlaps another's is refused", func(t *testing.T) {
		before := clusterNames(t, m)
		r := m.JoinToken("overlap", "10.1.128.0/17")
		if r.Err == nil {
			t.Fatalf("join-token with a pod CIDR inside east's was accepted: %s", r)
		}
		if strings.TrimSpace(r.Stdout) != "" {
			t.Errorf("refused join-token printed something on stdout: %q", r.Stdout)
		}
		msg := strings.ToLower(r.Stderr)
		if !containsAll(msg, "overlap", "10.1.128.0/17", "east") {
			t.Errorf("message should name the overlap, the CIDR and the cluster it overlaps (east 10.1.0.0/16): %q", r.Stderr)
		}
		t.Logf("refused as: %s", strings.TrimSpace(r.Stderr))
		if after := clusterNames(t, m); !slices.Equal(before, after) {
			t.Errorf("cluster list changed from %v to %v", before, after)
		}
	})

	t.Run("a malformed agent config is refused before anything is created", func(t *testing.T) {
		c := m.NewCluster("badconf", "10.7.0.0/16")
		c.WriteToken("cmj1.unused.unused")
		c.WriteConfig("bogusField: 1\n")
		linksBefore := m.Links(c.GwNS)
		c.StartAgent()
		code, err := c.Agent.Wait(20 * time.Second)
		if err != nil {
			t.Fatalf("agent with an unknown config field kept running: %v\n%s", err, c.Agent.Log())
		}
		log := c.Agent.Log()
		if code != 2 {
			t.Errorf("agent exited %d on an unknown config field, want 2 (bad config)", code)
		}
		if !strings.Contains(log, "bogusField") {
			t.Errorf("agent's error does not name the unknown field bogusField:\n%s", log)
		}
		t.Logf("refused as: %s", strings.TrimSpace(lastLine(log)))
		if after := m.Links(c.GwNS); !slices.Equal(linksBefore, after) {
			t.Errorf("links in %s changed from %v to %v", c.GwNS, linksBefore, after)
		}
		if _, err := os.Stat(c.StatusSocket); err == nil {
			t.Errorf("agent created its status socket %s", c.StatusSocket)
		}
		if entries, _ := os.ReadDir(c.StateDir); len(entries) > 0 {
			t.Errorf("agent wrote %d files into its state dir", len(entries))
		}
		nothingJoined(t, c)
	})

	if after := clusterNames(t, m); !slices.Equal(namesBefore, withoutNames(after, "late", "fake")) {
		t.Errorf("cluster list changed from %v to %v (besides the clusters the tokens were made for)", namesBefore, after)
	}
}

// forge flips one character in the signature part of a "cmj1.<claims>.<mac>" token, keeping it
// well-formed base64 so the broker has to check the MAC to refuse it.
func forge(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(parts[2]) < 4 {
		t.Fatalf("token %q is not cmj1.<claims>.<mac>", token)
	}
	mac := []byte(parts[2])
	i := len(mac) / 2
	if mac[i] == 'A' {
		mac[i] = 'B'
	} else {
		mac[i] = 'A'
	}
	parts[2] = string(mac)
	return strings.Join(parts, ".")
}

// clusterView is the part of `cablectl cluster list -o json` the tests read.
type clusterView struct {
	Name     string `json:"name"`
	Gateways []struct {
		Node string `json:"node"`
	} `json:"gateways"`
}

// clusterList reads the broker's clusters with `cablectl cluster list -o json`.
func clusterList(t *testing.T, m *harness.Mesh) []clusterView {
	t.Helper()
	r := m.Cablectl("cluster", "list", "-o", "json")
	if r.Err != nil {
		t.Fatalf("cluster list: %s", r)
	}
	var doc struct {
		Clusters []clusterView `json:"clusters"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("decode cluster list: %v: %q", err, r.Stdout)
	}
	return doc.Clusters
}

// clusterNames lists the broker's clusters, sorted.
func clusterNames(t *testing.T, m *harness.Mesh) []string {
	t.Helper()
	var names []string
	for _, c := range clusterList(t, m) {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	return names
}

func withoutNames(names []string, drop ...string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(drop, n) {
			out = append(out, n)
		}
	}
	return out
}

func containsAll(s string, subs ...string) bool {
	s = strings.ToLower(s)
	for _, sub := range subs {
		if !strings.Contains(s, strings.ToLower(sub)) {
			return false
		}
	}
	return true
}
