package broker

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
	"github.com/cablemesh/cablemesh/policy"
)

// policiesFromYAML decodes YAML the way cablectl does and returns the API form of each policy.
func policiesFromYAML(t *testing.T, y string) []*apiv1.Policy {
	t.Helper()
	ps, err := policy.DecodeYAML([]byte(y))
	if err != nil {
		t.Fatalf("decode test YAML: %v", err)
	}
	var out []*apiv1.Policy
	for _, p := range ps {
		b, err := json.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &apiv1.Policy{Name: p.Metadata.Name, Json: b})
	}
	return out
}

func (b *testBroker) apply(y string) *apiv1.ApplyPoliciesResponse {
	b.t.Helper()
	resp, err := b.admin.ApplyPolicies(ctxT(b.t), &apiv1.ApplyPoliciesRequest{Policies: policiesFromYAML(b.t, y)})
	if err != nil {
		b.t.Fatalf("apply: %v", err)
	}
	return resp
}

// policies lists the stored policies by name, decoded, with their status.
func (b *testBroker) policies() (map[string]*apiv1.Policy, map[string]policy.ClusterConnectionPolicy, map[string]policy.Status) {
	b.t.Helper()
	resp, err := b.admin.ListPolicies(ctxT(b.t), &apiv1.ListPoliciesRequest{})
	if err != nil {
		b.t.Fatal(err)
	}
	raw, decoded, st := map[string]*apiv1.Policy{}, map[string]policy.ClusterConnectionPolicy{}, map[string]policy.Status{}
	for _, p := range resp.Policies {
		var cp policy.ClusterConnectionPolicy
		if err := json.Unmarshal(p.Json, &cp); err != nil {
			b.t.Fatalf("policy %s: %v", p.Name, err)
		}
		var s policy.Status
		if err := json.Unmarshal(p.StatusJson, &s); err != nil {
			b.t.Fatalf("status of policy %s: %v", p.Name, err)
		}
		raw[p.Name], decoded[p.Name], st[p.Name] = p, cp, s
	}
	return raw, decoded, st
}

func (b *testBroker) labelledCluster(name, pods string, labels map[string]string) {
	b.t.Helper()
	if _, err := b.admin.CreateJoinToken(ctxT(b.t), &apiv1.CreateJoinTokenRequest{Cluster: name, PodCidrs: []string{pods}, Labels: labels}); err != nil {
		b.t.Fatalf("create cluster %s: %v", name, err)
	}
}

func seedFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "policy", "testdata", "seed004", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const onPremYAML = `
kind: ClusterConnectionPolicy
metadata: {name: on-prem}
spec:
  leftClusterSelector: {location: on-premise}
  rightClusterSelector: {location: on-premise}
  cableDriver: {name: vxlan}
  priority: 3
`

func TestTheDefaultPolicyIsCreatedAtFirstStartAndKeptAfterwards(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, brokerOpts{defaultDriver: "vxlan", durable: true})
	raw, pols, _ := b.policies()
	def, ok := pols[policy.DefaultPolicyName]
	if len(pols) != 1 || !ok || !raw["default"].IsDefault || def.Spec.CableDriver.Name != "vxlan" || def.Spec.EffectiveTopology() != policy.TopologyFullMesh ||
		def.EffectivePriority() != 0 || !def.Spec.Connects() || def.Origin != policy.OriginMesh {
		t.Fatalf("first start with --default-cable-driver vxlan stored %+v", pols)
	}
	b.stop()

	logs := &syncbuf.Buffer{}
	b = startBroker(t, dir, brokerOpts{defaultDriver: "ipsec", logTo: logs, durable: true})
	if _, pols, _ := b.policies(); pols["default"].Spec.CableDriver.Name != "vxlan" {
		t.Fatalf("a restart with another driver replaced the stored default: %+v", pols["default"])
	}
	if !strings.Contains(logs.String(), "differs from the stored mesh default policy") || !strings.Contains(logs.String(), "flag=ipsec") {
		t.Fatalf("a restart with another driver did not say so; log:\n%s", logs)
	}
	b.stop()

	logs = &syncbuf.Buffer{}
	b = startBroker(t, dir, brokerOpts{logTo: logs, durable: true})
	if strings.Contains(logs.String(), "differs") {
		t.Fatalf("a restart without the flag warned about it:\n%s", logs)
	}
	b.stop()

	_, err := New(t.Context(), Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", DefaultCableDriver: "gre"})
	if err == nil || !strings.Contains(err.Error(), `default cable driver "gre" is not one of ipsec, vxlan, vxlan+ipsec, wireguard`) {
		t.Fatalf("an unknown default driver: %v", err)
	}
}

func TestApplyReportsCreatedConfiguredAndUnchanged(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	w, err := east.client(t, b.addr).Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, w)

	r := b.apply(onPremYAML)
	if r.Outcomes[0] != admission.OutcomeCreated || r.Policies[0].Revision == 0 || r.Policies[0].IsDefault {
		t.Fatalf("first apply: %v", r)
	}
	created := r.Policies[0].Revision
	m := recv(t, w)
	if keys(m.Events) != "UPSERT:policy:on-prem@"+u64(created) {
		t.Fatalf("watch after create: %s", keys(m.Events))
	}
	var streamed policy.ClusterConnectionPolicy
	if err := json.Unmarshal(m.Events[0].GetResource().GetPolicy().GetJson(), &streamed); err != nil || streamed.Spec.CableDriver.Name != "vxlan" || streamed.Origin != "mesh" {
		t.Fatalf("streamed policy %+v (%v): want the on-prem policy with origin mesh", streamed, err)
	}
	if len(m.Events[0].GetResource().GetPolicy().GetStatusJson()) != 0 {
		t.Fatal("a watch event carries a policy status")
	}

	// The same spec again, even spelled differently (shorthand selectors, seed kind), changes nothing.
	r = b.apply(`
kind: ClusterConnectionPolicies
metadata: {name: on-prem}
spec:
  leftClusterSelector: {matchLabels: {location: on-premise}}
  rightClusterSelector: {location: on-premise}
  topology: ""
  cableDriver: {name: vxlan}
  priority: 3
`)
	if r.Outcomes[0] != admission.OutcomeUnchanged || r.Policies[0].Revision != created {
		t.Fatalf("re-apply of the same spec: %v, want unchanged at revision %d", r, created)
	}
	r = b.apply(strings.Replace(onPremYAML, "priority: 3", "priority: 4", 1))
	if r.Outcomes[0] != admission.OutcomeConfigured || r.Policies[0].Revision <= created {
		t.Fatalf("apply with a new priority: %v, want configured at a new revision", r)
	}
	// The unchanged apply produced no event: the next one is the configure.
	if m := recv(t, w); keys(m.Events) != "UPSERT:policy:on-prem@"+u64(r.Policies[0].Revision) {
		t.Fatalf("watch: %s, want only the configure", keys(m.Events))
	}

	// A dry run reports without storing.
	dry, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{DryRun: true,
		Policies: policiesFromYAML(t, strings.Replace(onPremYAML, "on-prem}", "other}", 1)+"\n---\n"+onPremYAML)})
	if err != nil || strings.Join(dry.Outcomes, ",") != "created,configured" {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if raw, pols, _ := b.policies(); len(pols) != 2 || raw["on-prem"].Revision != r.Policies[0].Revision {
		t.Fatalf("a dry run stored something: %v", raw)
	}

	// The default policy can be changed like any other and stays the default.
	r = b.apply(strings.Replace(seedFile(t, "01-default-connect.yaml"), "public-internet", "default", 1))
	if r.Outcomes[0] != admission.OutcomeConfigured || !r.Policies[0].IsDefault {
		t.Fatalf("re-applying the default with ipsec: %v", r)
	}
	if _, pols, _ := b.policies(); pols["default"].Spec.CableDriver.Name != "ipsec" {
		t.Fatalf("default after apply: %+v", pols["default"])
	}
}

func TestApplyIsAllOrNothingAndNamesWhatIsWrong(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	good := policiesFromYAML(t, onPremYAML)[0]
	mk := func(name, js string) *apiv1.Policy { return &apiv1.Policy{Name: name, Json: []byte(js)} }
	tests := []struct {
		name      string
		policies  []*apiv1.Policy
		fragments []string
	}{
		{"an unknown topology names the policy, the field and the value",
			[]*apiv1.Policy{good, mk("bad", `{"kind":"ClusterConnectionPolicy","metadata":{"name":"bad"},"spec":{"topology":"star"}}`)},
			[]string{`policy "bad"`, "spec.topology", `"star"`, "nothing applied"}},
		{"a no-connect policy with a driver is refused",
			[]*apiv1.Policy{mk("nc", `{"kind":"ClusterConnectionPolicy","metadata":{"name":"nc"},"spec":{"connectionPolicy":"no-connect","cableDriver":{"name":"vxlan"}}}`), good},
			[]string{`policy "nc"`, "spec.cableDriver", `"vxlan"`}},
		{"an unknown field is refused",
			[]*apiv1.Policy{good, mk("x", `{"kind":"ClusterConnectionPolicy","metadata":{"name":"x"},"spec":{"colour":"red"}}`)},
			[]string{`policy "x"`, `unknown field "colour"`}},
		{"a name that differs from metadata.name is refused",
			[]*apiv1.Policy{mk("x", `{"kind":"ClusterConnectionPolicy","metadata":{"name":"y"},"spec":{}}`)},
			[]string{`metadata.name "y" differs from the name "x"`}},
		{"a bad selector value names the field",
			[]*apiv1.Policy{mk("sel", `{"kind":"ClusterConnectionPolicy","metadata":{"name":"sel"},"spec":{"clusterSelector":{"env":"no spaces"}}}`)},
			[]string{`policy "sel"`, "spec.clusterSelector", "no spaces"}},
		{"two policies of the same name are refused",
			[]*apiv1.Policy{good, good},
			[]string{`metadata.name "on-prem" is also the name of policy 1`}},
		{"a policy without JSON is refused",
			[]*apiv1.Policy{{Name: "empty"}},
			[]string{`policy "empty": json is empty`}},
		{"an empty request is refused",
			nil,
			[]string{"no policies to apply"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.admin.ApplyPolicies(ctxT(t), &apiv1.ApplyPoliciesRequest{Policies: tt.policies})
			wantCode(t, err, codes.InvalidArgument, tt.fragments...)
			if raw, _, _ := b.policies(); len(raw) != 1 {
				t.Fatalf("a refused apply stored something: %v", raw)
			}
		})
	}
}

func TestDeletePolicies(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	b.apply(onPremYAML + "\n---\n" + seedFile(t, "05-cloud-a-default.yaml"))

	_, err := b.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{Names: []string{"on-prem", "nope", "gone"}})
	wantCode(t, err, codes.NotFound, `policy "nope", "gone" not found`, "nothing deleted")
	_, err = b.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{Names: []string{"on-prem", "default"}})
	wantCode(t, err, codes.FailedPrecondition, `policy "default" is the mesh default policy and cannot be deleted`)
	_, err = b.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{})
	wantCode(t, err, codes.InvalidArgument, "no policy names")
	if raw, _, _ := b.policies(); len(raw) != 3 {
		t.Fatalf("refused deletes removed something: %v", raw)
	}

	r, err := b.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{Names: []string{"on-prem", "cloud-a-default", "on-prem"}})
	if err != nil || strings.Join(r.Deleted, ",") != "on-prem,cloud-a-default" {
		t.Fatalf("delete: %v %v", r, err)
	}
	if raw, _, _ := b.policies(); len(raw) != 1 || raw["default"] == nil {
		t.Fatalf("after delete: %v, want only the default", raw)
	}
}

// The four clusters of the seed's multiple-cables example.
func seedMesh(t *testing.T, b *testBroker) {
	t.Helper()
	b.labelledCluster("op1", "10.1.0.0/16", map[string]string{"location": "on-premise", "env": "production"})
	b.labelledCluster("op2", "10.2.0.0/16", map[string]string{"location": "on-premise", "env": "staging"})
	b.labelledCluster("cl1", "10.3.0.0/16", map[string]string{"location": "cloud", "env": "production"})
	b.labelledCluster("cl2", "10.4.0.0/16", map[string]string{"location": "cloud", "env": "staging"})
}

func TestListPoliciesReportsPairsDecidedAndConflictsLost(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	seedMesh(t, b)
	b.apply(seedFile(t, "03-on-prem.yaml") + "\n---\n" + seedFile(t, "04-on-prem-to-cloud.yaml") + "\n---\n" + seedFile(t, "05-cloud-a-default.yaml"))
	_, _, st := b.policies()
	// op1-op2 on-prem; op1-cl1 on-prem-to-cloud; cl1-cl2 cloud-a-default; the other three the default.
	for name, want := range map[string][2]int{"on-prem": {1, 1}, "on-prem-to-cloud": {1, 1}, "cloud-a-default": {1, 1}, "default": {3, 3}} {
		if st[name].PairsDecided != want[0] || st[name].PairsConnected != want[1] || st[name].ConflictsLost != 0 {
			t.Errorf("status of %s: %+v, want %d decided, %d connected, no conflicts", name, st[name], want[0], want[1])
		}
	}
	b.apply(seedFile(t, "06-on-prem-to-cloud-no-connect.yaml"))
	_, _, st = b.policies()
	if s := st["on-prem-to-cloud"]; s.PairsDecided != 0 || s.ConflictsLost != 1 || len(s.Conflicts) != 1 ||
		s.Conflicts[0] != (policy.Conflict{ClusterA: "cl1", ClusterB: "op1", Winner: "on-prem-to-cloud-no-connect"}) {
		t.Fatalf("on-prem-to-cloud after a conflicting no-connect: %+v", s)
	}
	if s := st["on-prem-to-cloud-no-connect"]; s.PairsDecided != 1 || s.PairsConnected != 0 {
		t.Fatalf("the no-connect policy: %+v", s)
	}
	// A label change moves pairs: cl2 becomes production, so op1-cl2 is now a conflict too.
	if _, err := b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "cl2", Set: map[string]string{"env": "production"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, st = b.policies(); st["on-prem-to-cloud"].ConflictsLost != 2 || st["default"].PairsDecided != 2 {
		t.Fatalf("after relabelling cl2: %+v / default %+v", st["on-prem-to-cloud"], st["default"])
	}
}

func TestExplainMatchesTheResolver(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	seedMesh(t, b)
	files := []string{"03-on-prem.yaml", "04-on-prem-to-cloud.yaml", "05-cloud-a-default.yaml", "06-on-prem-to-cloud-no-connect.yaml"}
	var all []policy.ClusterConnectionPolicy
	for _, f := range files {
		b.apply(seedFile(t, f))
		ps, err := policy.DecodeYAML([]byte(seedFile(t, f)))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			p.Origin = policy.OriginMesh
			all = append(all, p)
		}
	}
	labels := map[string]map[string]string{}
	for _, c := range b.list().Clusters {
		labels[c.Name] = c.Labels
	}
	r := policy.NewResolver(all, policy.DefaultPolicy("wireguard"))
	names := []string{"op1", "op2", "cl1", "cl2"}
	for i, a := range names {
		for _, bb := range names[i+1:] {
			resp, err := b.admin.ExplainConnection(ctxT(t), &apiv1.ExplainConnectionRequest{ClusterA: bb, ClusterB: a})
			if err != nil {
				t.Fatal(err)
			}
			var got policy.Explanation
			if err := json.Unmarshal(resp.Json, &got); err != nil {
				t.Fatal(err)
			}
			want := r.Explain(policy.Cluster{Name: a, Labels: labels[a]}, policy.Cluster{Name: bb, Labels: labels[bb]})
			wj, _ := json.Marshal(want)
			gj, _ := json.Marshal(got)
			if !bytes.Equal(wj, gj) {
				t.Errorf("explain %s %s:\n got %s\nwant %s", bb, a, gj, wj)
			}
		}
	}
	resp, _ := b.admin.ExplainConnection(ctxT(t), &apiv1.ExplainConnectionRequest{ClusterA: "cl1", ClusterB: "op1"})
	if !strings.Contains(string(resp.Json), `"policy":"on-prem-to-cloud-no-connect"`) || !strings.Contains(string(resp.Json), `"lost conflict"`) {
		t.Fatalf("explain cl1 op1: %s", resp.Json)
	}

	_, err := b.admin.ExplainConnection(ctxT(t), &apiv1.ExplainConnectionRequest{ClusterA: "op1", ClusterB: "mars"})
	wantCode(t, err, codes.NotFound, `cluster "mars" not found`)
	_, err = b.admin.ExplainConnection(ctxT(t), &apiv1.ExplainConnectionRequest{ClusterA: "venus", ClusterB: "mars"})
	wantCode(t, err, codes.NotFound, `cluster "venus" and "mars" not found`)
	_, err = b.admin.ExplainConnection(ctxT(t), &apiv1.ExplainConnectionRequest{ClusterA: "op1", ClusterB: "op1"})
	wantCode(t, err, codes.InvalidArgument, "does not connect to itself")
}

// wantPSK is the documented derivation, written out independently of PairPSK.
// wantPSK is the PSK of the pair of clusters a and b as the broker derives it: from the mesh
// secret and the clusters' UIDs.
func wantPSK(t *testing.T, b *testBroker, a, c string) []byte {
	t.Helper()
	secret, err := os.ReadFile(filepath.Join(b.dir, MeshSecretFile))
	if err != nil || len(secret) != 32 {
		t.Fatalf("mesh secret: %d bytes, %v", len(secret), err)
	}
	uids := map[string]string{}
	for _, cl := range b.list().Clusters {
		uids[cl.Name] = cl.Uid
	}
	lo, hi := min(uids[a], uids[c]), max(uids[a], uids[c])
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("cablemesh psk v2|" + lo + "|" + hi))
	return m.Sum(nil)
}

// clusterPSKs maps the cluster records of watch events to the PSK each carries (nil if none).
func clusterPSKs(evs []*apiv1.Event) map[string][]byte {
	out := map[string][]byte{}
	for _, ev := range evs {
		if c := ev.GetResource().GetCluster(); c != nil {
			out[c.Name] = c.PairPsk
		}
	}
	return out
}

func TestEachAgentGetsThePSKsOfItsOwnPairsOnly(t *testing.T) {
	dir := t.TempDir()
	logs := &syncbuf.Buffer{}
	b := startBroker(t, dir, brokerOpts{logTo: logs})
	tokens := map[string]string{}
	for i, c := range []string{"east", "west", "north"} {
		tokens[c] = b.token(c, "10."+strconv.Itoa(i+1)+".0.0/16")
	}
	// Every cluster exists before the first watch, so each snapshot holds all three.
	watch := func(cluster string) apiv1.Agent_WatchClient {
		t.Helper()
		w, err := mustJoin(t, b.addr, tokens[cluster], cluster, "gw1").client(t, b.addr).Watch(ctxT(t), &apiv1.WatchRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	we, ww, wn := watch("east"), watch("west"), watch("north")
	eastWest := wantPSK(t, b, "east", "west")
	se, sw, sn := clusterPSKs(recv(t, we).Events), clusterPSKs(recv(t, ww).Events), clusterPSKs(recv(t, wn).Events)

	if len(eastWest) != 32 || !bytes.Equal(se["west"], eastWest) || !bytes.Equal(sw["east"], eastWest) {
		t.Fatalf("east sees west with PSK %x, west sees east with %x; want both %x", se["west"], sw["east"], eastWest)
	}
	if !bytes.Equal(se["north"], wantPSK(t, b, "east", "north")) || !bytes.Equal(sn["east"], se["north"]) {
		t.Fatalf("east-north PSK: east sees %x, north sees %x", se["north"], sn["east"])
	}
	if se["east"] != nil || sw["west"] != nil || sn["north"] != nil {
		t.Fatal("an agent's own cluster record carries a PSK")
	}
	for name, psk := range sn {
		if bytes.Equal(psk, eastWest) {
			t.Fatalf("north's watch carries the east-west PSK on %s", name)
		}
	}

	// Deltas carry them too: a label change reaches every agent with its own pair's key.
	if _, err := b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "west", Set: map[string]string{"env": "prod"}}); err != nil {
		t.Fatal(err)
	}
	de, dn := recv(t, we), recv(t, wn)
	if keys(de.Events) != "UPSERT:cluster:west@"+u64(de.Revision) || de.Events[0].GetResource().GetCluster().GetLabels()["env"] != "prod" {
		t.Fatalf("east got %s after a label change of west", keys(de.Events))
	}
	if !bytes.Equal(clusterPSKs(de.Events)["west"], eastWest) || !bytes.Equal(clusterPSKs(dn.Events)["west"], wantPSK(t, b, "north", "west")) {
		t.Fatal("the label delta of west does not carry each watcher's own pair PSK")
	}
	if dw := recv(t, ww); clusterPSKs(dw.Events)["west"] != nil {
		t.Fatal("west's own label delta carries a PSK")
	}

	// Admin responses never do.
	for _, c := range b.list().Clusters {
		if c.PairPsk != nil {
			t.Fatalf("ListClusters returns a PSK on %s", c.Name)
		}
	}
	c, err := b.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"env": "prod"}})
	if err != nil || c.PairPsk != nil {
		t.Fatalf("LabelCluster: %v %v", c, err)
	}
	// Nor the log, in any common spelling.
	for _, spelling := range []string{hex.EncodeToString(eastWest), base64.StdEncoding.EncodeToString(eastWest), string(eastWest)} {
		if strings.Contains(logs.String(), spelling) {
			t.Fatal("the broker logged a PSK")
		}
	}

	// The mesh secret survives a restart, so the keys do.
	st, err := os.Stat(filepath.Join(dir, MeshSecretFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mesh secret: %v mode %v, want 0600", err, st.Mode().Perm())
	}
	before, _ := os.ReadFile(filepath.Join(dir, MeshSecretFile))
	b.stop()
	startBroker(t, dir, brokerOpts{})
	if after, _ := os.ReadFile(filepath.Join(dir, MeshSecretFile)); len(before) != 32 || !bytes.Equal(before, after) {
		t.Fatal("the mesh secret changed across a restart")
	}
}

func TestPairPSKIsSymmetricAndDistinct(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, 32)
	if !bytes.Equal(PairPSK(secret, "a", "b"), PairPSK(secret, "b", "a")) {
		t.Fatal("PairPSK(a, b) != PairPSK(b, a)")
	}
	// The separator keeps ("ab", "c") and ("a", "bc") apart.
	if bytes.Equal(PairPSK(secret, "ab", "c"), PairPSK(secret, "a", "bc")) || bytes.Equal(PairPSK(secret, "a", "b"), PairPSK(bytes.Repeat([]byte{8}, 32), "a", "b")) {
		t.Fatal("different pairs or secrets gave the same key")
	}
}

func TestTheWatchStreamCarriesPolicies(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	ctx, cancel := context.WithCancel(ctxT(t))
	w, err := east.client(t, b.addr).Watch(ctx, &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap := recv(t, w)
	var def *apiv1.Policy
	for _, ev := range snap.Events {
		if ev.Kind == "policy" {
			def = ev.GetResource().GetPolicy()
		}
	}
	if def == nil || def.Name != "default" || !def.IsDefault || len(def.Json) == 0 {
		t.Fatalf("snapshot %s lacks the default policy", keys(snap.Events))
	}
	b.apply(onPremYAML)
	up := recv(t, w)
	cancel()
	if _, err := b.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{Names: []string{"on-prem"}}); err != nil {
		t.Fatal(err)
	}
	// A reconnecting agent resumes and gets the delete.
	w2, err := east.client(t, b.addr).Watch(ctxT(t), &apiv1.WatchRequest{SinceRevision: up.Revision})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, w2); m.Snapshot || keys(m.Events) != "DELETE:policy:on-prem@"+u64(up.Revision+1) {
		t.Fatalf("resume after a policy delete: %s", keys(m.Events))
	}
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }
