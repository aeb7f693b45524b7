package netns

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// HACatchUp is how long agents may take, after a broker replica and an etcd member die, to be
// connected again and current with a change made after the failures.
const HACatchUp = 5 * time.Second

// TestHAOnEtcd: three etcd members and two cable-broker replicas; three gateways configured with
// both replicas (`broker: a:7443,b:7443`). While a stream of policy changes goes to the brokers
// and clusters are created through both replicas at once, the replica most gateways watch and
// the etcd leader are killed (SIGKILL). Then: every gateway is connected again and has a change
// made after the failures within HACatchUp; every policy a client got an OK for is present; no
// cluster ID was handed out twice; the mesh still carries traffic; the killed member and replica
// rejoin.
func TestHAOnEtcd(t *testing.T) {
	h := harness.NewHA(t, 3, 2)
	var clusters []*harness.Cluster
	for _, spec := range threeClusters {
		name, cidr, _ := strings.Cut(spec, "=")
		clusters = append(clusters, h.AddCluster(name, cidr))
	}
	for _, c := range clusters {
		c.StartAgent()
	}
	h.WaitConnected(ConnectTimeout, clusters...)

	// The client side of the streams: what got an OK.
	var (
		mu             sync.Mutex
		ackedPolicies  []string
		failedPolicies int
		ackedClusters  = map[string]string{} // name -> replica address it was created through
		failedClusters = map[string]int{}    // replica address -> creations that failed through it
		stop           = make(chan struct{})
		wg             sync.WaitGroup
	)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("ha-%04d", i)
			path := h.PolicyFile(name+".yaml", haPolicy(name))
			r := h.Cablectl("apply", "-f", path)
			mu.Lock()
			if r.Err == nil {
				ackedPolicies = append(ackedPolicies, name)
			} else {
				failedPolicies++
				h.Logf("apply %s failed (not acknowledged): %s", name, strings.TrimSpace(r.Stderr))
			}
			mu.Unlock()
		}
	})
	for ri, r := range h.Replicas {
		wg.Go(func() {
			for i := 0; i < 40; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("x%d-%02d", ri, i)
				res := h.CablectlVia(r, "cluster", "join-token", name, "--pod-cidr", fmt.Sprintf("10.%d.%d.0/24", 100+ri, i))
				mu.Lock()
				if res.Err == nil {
					ackedClusters[name] = r.Address()
				} else {
					failedClusters[r.Address()]++
				}
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	time.Sleep(3 * time.Second)

	// The victims: the replica that holds the most gateways' watch streams, and the etcd leader.
	// (Each gateway has a connection to both replicas and spreads its calls over them.)
	watchers := h.WatchStreams()
	victim := h.Replicas[0]
	for i, w := range watchers {
		if len(w) > len(watchers[victim.Index]) {
			victim = h.Replicas[i]
		}
	}
	survivor := h.Replicas[1-victim.Index]
	member := h.EtcdLeader()
	which := "leader"
	if member < 0 {
		member, which = 0, "member (etcdctl not installed to find the leader)"
	}
	t.Logf("watch streams per replica before the failures: %v; killing broker %d and etcd %s %s",
		watchers, victim.Index+1, which, h.Etcd[member].Name)
	mu.Lock()
	before := len(ackedPolicies)
	mu.Unlock()
	t0 := time.Now()
	h.Kill(victim.Proc)
	h.Kill(h.Etcd[member].Proc)

	// A change made right after the failures, through whichever replica answers.
	var markerAcked time.Time
	marker := h.PolicyFile("ha-marker.yaml", haPolicy("ha-marker"))
	err := harness.WaitFor(20*time.Second, 100*time.Millisecond, func() (bool, string) {
		r := h.Cablectl("apply", "-f", marker)
		markerAcked = time.Now()
		return r.Err == nil, r.String()
	})
	if err != nil {
		t.Fatalf("no replica took a change after the failures: %v", err)
	}
	rev := listRevision(t, h.CablectlVia(survivor, "connection-policy", "list", "-o", "json"))
	t.Logf("change after the failures acknowledged %s after them, at revision %d", markerAcked.Sub(t0).Round(time.Millisecond), rev)

	t.Run("every gateway reconnects and catches up within 5s", func(t *testing.T) {
		current := map[string]time.Duration{}
		last := map[string]string{}
		deadline := time.Now().Add(30 * time.Second)
		for len(current) < len(clusters) && time.Now().Before(deadline) {
			for _, c := range clusters {
				if _, ok := current[c.Name]; ok {
					continue
				}
				st, err := c.Status()
				if err != nil {
					last[c.Name] = err.Error()
					continue
				}
				last[c.Name] = fmt.Sprintf("connected=%v revision=%d error=%q", st.Broker.Connected, st.Broker.Revision, st.Broker.Error)
				if st.Broker.Connected && st.Broker.Revision >= rev {
					current[c.Name] = time.Since(t0)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		var worst time.Duration
		for _, c := range clusters {
			took, ok := current[c.Name]
			if !ok {
				t.Errorf("%s did not catch up within 30s: %s", c.Name, last[c.Name])
				continue
			}
			worst = max(worst, took)
			t.Logf("%s connected and at revision >= %d %s after the failures", c.Name, rev, took.Round(time.Millisecond))
		}
		t.Logf("slowest gateway current %s after the failures (%s after the change was acknowledged)",
			worst.Round(time.Millisecond), (worst - markerAcked.Sub(t0)).Round(time.Millisecond))
		if worst > HACatchUp {
			t.Errorf("slowest gateway took %s to catch up, want at most %s", worst.Round(time.Millisecond), HACatchUp)
		}
		if after := h.Watchers(); len(after[victim.Index]) != 0 || len(after[survivor.Index]) < len(clusters) {
			t.Errorf("gateways connected to each replica after the failures: %v; want every one on broker %d only", after, survivor.Index+1)
		}
		if streams := h.WatchStreams(); len(streams[survivor.Index]) != len(clusters) {
			t.Errorf("watch streams per replica after the failures: %v; want every one on broker %d", streams, survivor.Index+1)
		}
	})

	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	mu.Lock()
	t.Logf("policy stream: %d acknowledged (%d before the failures), %d not; clusters: %d created, failed through each replica: %v (broker %d was killed)",
		len(ackedPolicies), before, failedPolicies, len(ackedClusters), failedClusters, victim.Index+1)
	mu.Unlock()
	if len(ackedPolicies) <= before {
		t.Errorf("no policy change was acknowledged after the failures")
	}

	t.Run("no acknowledged write is lost", func(t *testing.T) {
		names := policyNames(t, h.CablectlVia(survivor, "connection-policy", "list", "-o", "json"))
		for _, n := range append(ackedPolicies, "ha-marker") {
			if !slices.Contains(names, n) {
				t.Errorf("policy %s was acknowledged but is missing", n)
			}
		}
	})

	t.Run("no cluster ID is handed out twice", func(t *testing.T) {
		r := h.CablectlVia(survivor, "cluster", "list", "-o", "json")
		var doc struct {
			Clusters []struct {
				Name string `json:"name"`
				ID   uint32 `json:"id"`
			} `json:"clusters"`
		}
		if r.Err != nil || json.Unmarshal([]byte(r.Stdout), &doc) != nil {
			t.Fatalf("cluster list: %s", r)
		}
		ids := map[uint32]string{}
		have := map[string]bool{}
		for _, c := range doc.Clusters {
			if other, dup := ids[c.ID]; dup {
				t.Errorf("clusters %s and %s share ID %d", other, c.Name, c.ID)
			}
			ids[c.ID] = c.Name
			have[c.Name] = true
		}
		for name, via := range ackedClusters {
			if !have[name] {
				t.Errorf("cluster %s was created through %s (acknowledged) but is missing", name, via)
			}
		}
		t.Logf("%d clusters, %d distinct IDs", len(doc.Clusters), len(ids))
	})

	t.Run("the killed member and replica rejoin and the mesh carries traffic", func(t *testing.T) {
		h.StartEtcd(h.Etcd[member])
		h.StartReplica(victim)
		if r := h.CablectlVia(victim, "connection-policy", "list", "-o", "json"); r.Err != nil || !slices.Contains(policyNames(t, r), "ha-marker") {
			t.Fatalf("restarted replica does not serve the mesh's policies: %s", r)
		}
		for _, from := range clusters {
			for _, to := range clusters {
				if from != to {
					if ok, r := h.PingOK(from.PodNS, to.PodIP, 3); !ok {
						t.Errorf("ping %s -> %s: %d/%d: %s", from.Name, to.Name, r.Received, r.Transmitted, r.Output)
					}
				}
			}
		}
	})
}

// haPolicy is a connect policy that matches no cluster: every apply is a change every agent
// receives, without changing which pairs connect.
func haPolicy(name string) string {
	return fmt.Sprintf(`kind: ClusterConnectionPolicies
metadata:
  name: %s
spec:
  clusterSelector:
    ha-test: %s
  topology: full-mesh
  connectionPolicy: connect
  priority: 1
`, name, name)
}

func listRevision(t *testing.T, r harness.Result) uint64 {
	t.Helper()
	var doc struct {
		Revision uint64 `json:"revision"`
	}
	if r.Err != nil || json.Unmarshal([]byte(r.Stdout), &doc) != nil {
		t.Fatalf("list: %s", r)
	}
	return doc.Revision
}

func policyNames(t *testing.T, r harness.Result) []string {
	t.Helper()
	var doc struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if r.Err != nil || json.Unmarshal([]byte(r.Stdout), &doc) != nil {
		t.Fatalf("policy list: %s", r)
	}
	var out []string
	for _, p := range doc.Items {
		out = append(out, p.Metadata.Name)
	}
	return out
}
