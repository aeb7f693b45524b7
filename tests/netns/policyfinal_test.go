package netns

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/policy"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// stayDisconnected fails the test if, within d, either end of the pair shows a connection to
// the other (a cluster's policy lifting the mesh's no-connect would bring it up in seconds).
func stayDisconnected(t *testing.T, d time.Duration, x, y *harness.Cluster) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, pair := range [][2]*harness.Cluster{{x, y}, {y, x}} {
			st, err := pair[0].Status()
			if err != nil {
				continue
			}
			if c, ok := harness.Connection(st, pair[1].Name); ok {
				t.Fatalf("%s has a connection to %s (driver %s, policy %s, state %s): a cluster's policy lifted the mesh's no-connect",
					pair[0].Name, pair[1].Name, c.Driver, c.Policy, c.State)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestClusterPolicyCannotLiftTheMeshsNo: the admin isolates east from west (mesh policy
// isolate-west, no-connect, priority 100); east's policyDir then connects east-west at priority
// 2147483647: the pair stays disconnected on both ends, and explain says why east's policy lost.
// Then a final mesh policy puts east-north on wireguard: east's policyDir file asking vxlan at
// the highest priority changes nothing.
func TestClusterPolicyCannotLiftTheMeshsNo(t *testing.T) {
	harness.RequireRoot(t)
	p := startPolicyDirMesh(t)
	m, east, west, north, all := p.m, p.east, p.west, p.north, p.all
	wg := harness.Connected(harness.DriverWireGuard)
	pair := harness.PairKey

	t0 := m.Apply(m.PolicyFile("isolate-west.yaml", `apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata: {name: isolate-west}
spec:
  leftClusterSelector: {matchLabels: {name: east}}
  rightClusterSelector: {matchLabels: {name: west}}
  priority: 100
  connectionPolicy: no-connect
`))
	m.WaitWants(PolicyTimeout, t0, all, harness.Wants{pair("east", "west"): harness.NoConnect}, wg)
	m.Logf("the mesh isolated east from west")

	waitListed := func(synced string) {
		t.Helper()
		err := harness.WaitFor(30*time.Second, 300*time.Millisecond, func() (bool, string) {
			r := m.Cablectl("connection-policy", "list")
			return r.Err == nil && strings.Contains(r.Stdout, synced), r.String()
		})
		if err != nil {
			t.Fatalf("the broker does not list east's policy %s: %v\n%s", synced, err, east.Agent.LogTail(20))
		}
	}

	t.Run("east's policy at the highest priority cannot reconnect west", func(t *testing.T) {
		p.write(t, "reconnect.yaml", `apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata:
  name: reconnect
  labels: {`+policy.LabelOrigin+`: `+policy.OriginClusterLabel+`}
spec:
  leftClusterSelector: {matchLabels: {name: east}}
  rightClusterSelector: {matchLabels: {name: west}}
  priority: 2147483647
  cableDriver: {name: vxlan}
`)
		waitListed(policy.ClusterPolicyName("reconnect", "east"))
		stayDisconnected(t, 12*time.Second, east, west)
		explain := m.Explain("east", "west")
		if !strings.Contains(explain, "isolate-west") || !strings.Contains(explain, "mesh forbids") {
			t.Errorf("explain east west does not say the mesh's no-connect overrules east's policy:\n%s", explain)
		} else {
			m.Logf("explain east west:\n%s", explain)
		}
		m.WaitWants(10*time.Second, time.Now(), all, harness.Wants{pair("east", "west"): harness.NoConnect}, wg)
	})

	t.Run("a final mesh policy keeps its driver against east's policy", func(t *testing.T) {
		t0 := m.Apply(m.PolicyFile("north-wireguard.yaml", `apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata: {name: north-wireguard}
spec:
  leftClusterSelector: {matchLabels: {name: east}}
  rightClusterSelector: {matchLabels: {name: north}}
  priority: 1
  final: true
  cableDriver: {name: wireguard}
`))
		m.WaitWants(PolicyTimeout, t0, all, harness.Wants{pair("east", "west"): harness.NoConnect}, wg)
		p.write(t, "north-vxlan.yaml", `apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata:
  name: north-vxlan
  labels: {`+policy.LabelOrigin+`: `+policy.OriginClusterLabel+`}
spec:
  leftClusterSelector: {matchLabels: {name: east}}
  rightClusterSelector: {matchLabels: {name: north}}
  priority: 2147483647
  cableDriver: {name: vxlan}
`)
		waitListed(policy.ClusterPolicyName("north-vxlan", "east"))
		deadline := time.Now().Add(12 * time.Second)
		for time.Now().Before(deadline) {
			for _, c := range []*harness.Cluster{east, north} {
				st, err := c.Status()
				if err != nil {
					continue
				}
				other := "north"
				if c == north {
					other = "east"
				}
				if conn, ok := harness.Connection(st, other); ok && conn.Driver != harness.DriverWireGuard {
					t.Fatalf("%s-%s moved to %s (policy %s): east's policy beat a final mesh policy", c.Name, other, conn.Driver, conn.Policy)
				}
			}
			time.Sleep(300 * time.Millisecond)
		}
		m.WaitWants(10*time.Second, time.Now(), all, harness.Wants{pair("east", "west"): harness.NoConnect}, wg)
		if explain := m.Explain("east", "north"); !strings.Contains(explain, "final") {
			t.Errorf("explain east north does not say the mesh policy is final:\n%s", explain)
		}
	})
}
