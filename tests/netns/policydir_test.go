package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/policy"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// clusterPolicyYAML is a policy for cluster east's policyDir: east and `to` connect over driver.
// label writes the cablemesh.io/origin: cluster label, without which east must refuse it.
func clusterPolicyYAML(name, to, driver string, label bool) string {
	labels := "    team: net\n"
	if label {
		labels += "    " + policy.LabelOrigin + ": " + policy.OriginClusterLabel + "\n"
	}
	return fmt.Sprintf(`apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata:
  name: %s
  labels:
%sspec:
  leftClusterSelector: {name: east}
  rightClusterSelector: {name: %s}
  cableDriver:
    name: %s
`, name, labels, to, driver)
}

// policyDirMesh is the mesh of the cluster-scoped policy tests: labelled clusters east, west and
// north, each offering wireguard and vxlan, east reading the policy files of dir, and all three
// connected over wireguard by the mesh default policy.
type policyDirMesh struct {
	m                 *harness.Mesh
	east, west, north *harness.Cluster
	all               []*harness.Cluster
	dir               string
}

// startPolicyDirMesh builds the mesh of policyDirMesh and waits until the default policy has
// connected the three clusters over wireguard.
func startPolicyDirMesh(t *testing.T) *policyDirMesh {
	t.Helper()
	m := harness.New(t)
	drivers := fmt.Sprintf("cableDrivers: [wireguard, vxlan]\nvxlan: {port: %d, vni: %d}\n", harness.VXLANPort, harness.VXLANVNI)
	p := &policyDirMesh{m: m, dir: filepath.Join(m.Dir, "east-policies")}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.east = m.AddLabelledCluster("east", "10.1.0.0/16", "name=east", drivers+"policyDir: "+p.dir+"\n")
	p.west = m.AddLabelledCluster("west", "10.2.0.0/16", "name=west", drivers)
	p.north = m.AddLabelledCluster("north", "10.3.0.0/16", "name=north", drivers)
	p.all = []*harness.Cluster{p.east, p.west, p.north}
	started := time.Now()
	for _, c := range p.all {
		c.StartAgent()
	}
	m.WaitWants(2*time.Minute, started, p.all, nil, harness.Connected(harness.DriverWireGuard))
	m.Logf("the default policy connected the three clusters over wireguard")
	return p
}

// write puts text in east's policy file name and returns when it did. It writes a temporary file
// and renames it, as an editor or a ConfigMap update does: the agent never reads half a file.
func (p *policyDirMesh) write(t *testing.T, name, text string) time.Time {
	t.Helper()
	tmp := filepath.Join(p.dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(p.dir, name)); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// TestPolicyDirClusterScopedPolicies checks cluster-scoped policies on Universal hosts: a policy file in cluster
// east's policyDir, labelled cablemesh.io/origin: cluster, moves the east-west pair to vxlan on
// both ends (west resolves with the broker's copy); an unlabelled file is refused (east's status
// problems and log say to add the label) and changes nothing; editing the file moves the pair it
// decides; with the broker stopped east keeps the pair as decided; removing the file puts the
// default back.
func TestPolicyDirClusterScopedPolicies(t *testing.T) {
	harness.RequireRoot(t)
	p := startPolicyDirMesh(t)
	m, east, north, all, policyDir := p.m, p.east, p.north, p.all, p.dir
	wg, vx := harness.Connected(harness.DriverWireGuard), harness.Connected(harness.DriverVXLAN)
	pair := harness.PairKey
	file := filepath.Join(policyDir, "to-west.yaml")

	// 1. A labelled file: east-west over vxlan, on both ends.
	t0 := p.write(t, "to-west.yaml", clusterPolicyYAML("to-west", "west", "vxlan", true))
	conv := m.WaitWants(PolicyTimeout, t0, all, harness.Wants{pair("east", "west"): vx}, wg)
	m.Logf("east's policyDir file moved east-west to vxlan on both ends %s after it was written", conv.ConnectedAfter("east", "west").Round(time.Millisecond))
	synced := policy.ClusterPolicyName("to-west", "east")
	r := m.Cablectl("connection-policy", "list")
	if r.Err != nil {
		t.Fatalf("connection-policy list: %s", r)
	}
	if !lineWithAll(r.Stdout, synced, "cluster/east") {
		t.Errorf("connection-policy list has no %s with origin cluster/east:\n%s", synced, r.Stdout)
	}
	if strings.Contains(r.Stdout, "to-west ") {
		t.Errorf("the policy is listed under its local name, not %s:\n%s", synced, r.Stdout)
	}
	if r := m.Cablectl("connection-policy", "export"); r.Err != nil || strings.Contains(r.Stdout, synced) {
		t.Errorf("connection-policy export (the mesh's backup) includes east's policy or failed: %s", r)
	}

	// 2. An unlabelled file: refused, said in status and log, nothing changes.
	p.write(t, "to-north.yaml", clusterPolicyYAML("to-north", "north", "vxlan", false))
	err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st, err := east.Status()
		if err != nil {
			return false, err.Error()
		}
		for _, p := range st.Problems {
			if strings.Contains(p.Message, "to-north") && strings.Contains(p.Message, policy.MissingOriginLabelMessage) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("problems %v", st.Problems)
	})
	if err != nil {
		t.Fatalf("east's status does not report the unlabelled policy: %v", err)
	}
	if log := east.Agent.Log(); !strings.Contains(log, "cluster policy refused") || !strings.Contains(log, "please add") {
		t.Errorf("east's log does not say the policy was refused:\n%s", east.Agent.LogTail(30))
	}
	time.Sleep(3 * time.Second) // long enough for a wrongly accepted policy to reach the broker and back
	m.WaitWants(5*time.Second, time.Now(), all, harness.Wants{pair("east", "west"): vx}, wg)
	if r := m.Cablectl("connection-policy", "list"); strings.Contains(r.Stdout, "to-north") {
		t.Errorf("the unlabelled policy reached the broker:\n%s", r.Stdout)
	}
	if err := os.Remove(filepath.Join(policyDir, "to-north.yaml")); err != nil {
		t.Fatal(err)
	}

	// 3. Editing the file: the policy now decides east-north, and east-west goes back to the default.
	t0 = p.write(t, "to-west.yaml", clusterPolicyYAML("to-west", "north", "vxlan", true))
	conv = m.WaitWants(PolicyTimeout, t0, all, harness.Wants{pair("east", "north"): vx}, wg)
	m.Logf("the edit moved east-north to vxlan and east-west back to wireguard %s after it was written", conv.ConnectedAfter("east", "west", "north").Round(time.Millisecond))

	// 4. The broker stops: east keeps the pair as decided (from its cache), and traffic flows.
	m.StopBroker()
	err = harness.WaitFor(60*time.Second, 500*time.Millisecond, func() (bool, string) {
		st, err := east.Status()
		if err != nil {
			return false, err.Error()
		}
		return !st.Broker.Connected, "east still connected to the broker"
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	m.WaitWants(10*time.Second, time.Now(), all, harness.Wants{pair("east", "north"): vx}, wg)
	if ok, res := m.PingOK(east.PodNS, north.PodIP, 3); !ok {
		t.Errorf("east -> north over vxlan with the broker down: %d/%d", res.Received, res.Transmitted)
	}
	m.StartBroker()

	// 5. Removing the file deletes the broker's copy: the default decides again.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	conv = m.WaitWants(PolicyTimeout, t0, all, nil, wg)
	m.Logf("removing the file put every pair back on wireguard %s after", conv.ConnectedAfter("east", "north").Round(time.Millisecond))
	err = harness.WaitFor(20*time.Second, 500*time.Millisecond, func() (bool, string) {
		r := m.Cablectl("connection-policy", "list")
		return r.Err == nil && !strings.Contains(r.Stdout, synced), r.String()
	})
	if err != nil {
		t.Errorf("the broker still lists %s after the file was removed: %v", synced, err)
	}
}

// lineWithAll reports whether one line of out contains every word.
func lineWithAll(out string, words ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			return true
		}
	}
	return false
}
