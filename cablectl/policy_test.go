package cablectl

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

const seedDir = "../policy/testdata/seed004"

func seedFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(seedDir, "*.yaml"))
	if err != nil || len(files) != 8 {
		t.Fatalf("seed examples: %v %v, want 8 files", files, err)
	}
	sort.Strings(files)
	return files
}

func decodeFile(t *testing.T, path string) []policy.ClusterConnectionPolicy {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := policy.DecodeYAML(b)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// cablectlT runs cablectl against the broker whose admin.yaml is cfg and fails the test on error.
func cablectlT(t *testing.T, cfg, stdin string, args ...string) string {
	t.Helper()
	out, errOut, err := runCmd(t, stdin, append([]string{"--config", cfg}, args...)...)
	if err != nil {
		t.Fatalf("cablectl %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// listed returns the broker's policies by name as list -o json shows them.
func listed(t *testing.T, cfg string) map[string]policyView {
	t.Helper()
	var v policyListView
	if err := json.Unmarshal([]byte(cablectlT(t, cfg, "", "connection-policy", "list", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	out := map[string]policyView{}
	for _, p := range v.Items {
		out[p.Metadata.Name] = p
	}
	return out
}

func specJSON(t *testing.T, s policy.Spec) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEverySeedExampleAppliesAsWritten(t *testing.T) {
	cfg := startClusterTestBroker(t)
	for _, path := range seedFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			want := decodeFile(t, path)[0]
			out, errOut, err := runCmd(t, "", "--config", cfg, "apply", "-f", path)
			if err != nil {
				t.Fatalf("apply -f %s: %v\n%s", path, err, errOut)
			}
			// 01/02 and 07/08 share a name: the second of each pair replaces the first.
			if out != resourceName(want.Metadata.Name)+" created\n" && out != resourceName(want.Metadata.Name)+" configured\n" {
				t.Fatalf("apply printed %q", out)
			}
			if strings.HasPrefix(filepath.Base(path), "07") || strings.HasPrefix(filepath.Base(path), "08") {
				if !strings.HasPrefix(errOut, `Warning: `+path+`: line 1`) || !strings.Contains(errOut, `moved "priority: 3" from column 4 to column 3`) {
					t.Fatalf("the seed's mis-indented priority was repaired without a warning; stderr %q", errOut)
				}
			} else if errOut != "" {
				t.Fatalf("stderr %q", errOut)
			}
			got, ok := listed(t, cfg)[want.Metadata.Name]
			if !ok || specJSON(t, got.Spec) != specJSON(t, want.Spec) || got.Origin != policy.OriginMesh || got.Kind != policy.Kind {
				t.Fatalf("stored %+v, want the spec of the file %s", got, specJSON(t, want.Spec))
			}
			// Applying the same file again changes nothing.
			if out := cablectlT(t, cfg, "", "apply", "-f", path); out != resourceName(want.Metadata.Name)+" unchanged\n" {
				t.Fatalf("second apply printed %q", out)
			}
		})
	}
	// Several examples in one multi-document file, from stdin.
	var multi bytes.Buffer
	for _, f := range seedFiles(t)[2:6] {
		b, _ := os.ReadFile(f)
		multi.WriteString("---\n")
		multi.Write(b)
	}
	out := cablectlT(t, cfg, multi.String(), "apply", "-f", "-")
	want := "clusterconnectionpolicy/on-prem unchanged\nclusterconnectionpolicy/on-prem-to-cloud unchanged\n" +
		"clusterconnectionpolicy/cloud-a-default unchanged\nclusterconnectionpolicy/on-prem-to-cloud-no-connect unchanged\n"
	if out != want {
		t.Fatalf("multi-document apply from stdin printed:\n%s\nwant:\n%s", out, want)
	}
}

func TestApplyOfAnInvalidPolicyChangesNothing(t *testing.T) {
	cfg := startClusterTestBroker(t)
	file := filepath.Join(t.TempDir(), "mixed.yaml")
	good, _ := os.ReadFile(filepath.Join(seedDir, "03-on-prem.yaml"))
	bad := "kind: ClusterConnectionPolicy\nmetadata: {name: bad}\nspec:\n  topology: star\n"
	if err := os.WriteFile(file, []byte(string(good)+"---\n"+bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCmd(t, "", "--config", cfg, "apply", "-f", file)
	if err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `document 2 (bad)`) || !strings.Contains(err.Error(), `spec.topology: "star"`) {
		t.Fatalf("apply of a file with an invalid policy: %v; want a failure (exit 1) naming the document, field and value", err)
	}
	if got := listed(t, cfg); len(got) != 1 || got["default"].Metadata.Name == "" {
		t.Fatalf("after a refused apply the broker holds %v, want only the default policy", got)
	}
	// A dry run stores nothing either.
	if out := cablectlT(t, cfg, "", "apply", "--dry-run", "-f", filepath.Join(seedDir, "03-on-prem.yaml")); out != "clusterconnectionpolicy/on-prem created (dry run)\n" {
		t.Fatalf("dry run printed %q", out)
	}
	if got := listed(t, cfg); len(got) != 1 {
		t.Fatalf("a dry run stored something: %v", got)
	}
}

// seedMesh creates the four clusters of the seed's multiple-cables example through cablectl.
func seedMesh(t *testing.T, cfg string) map[string]map[string]string {
	t.Helper()
	labels := map[string]map[string]string{
		"op1": {"location": "on-premise", "env": "production"},
		"op2": {"location": "on-premise", "env": "staging"},
		"cl1": {"location": "cloud", "env": "production"},
		"cl2": {"location": "cloud", "env": "staging"},
	}
	for i, name := range []string{"op1", "op2", "cl1", "cl2"} {
		cablectlT(t, cfg, "", "cluster", "join-token", name, "--pod-cidr", "10."+string(rune('1'+i))+".0.0/16", "--labels", formatLabels(labels[name]))
	}
	return labels
}

func TestExplainMatchesPolicyResolve(t *testing.T) {
	cfg := startClusterTestBroker(t)
	labels := seedMesh(t, cfg)
	var all []policy.ClusterConnectionPolicy
	for _, f := range seedFiles(t)[2:6] {
		cablectlT(t, cfg, "", "apply", "-f", f)
		all = append(all, decodeFile(t, f)...)
	}
	names := []string{"cl1", "cl2", "op1", "op2"}
	for i, a := range names {
		for _, b := range names[i+1:] {
			var e policy.Explanation
			if err := json.Unmarshal([]byte(cablectlT(t, cfg, "", "connection-policy", "explain", b, a, "-o", "json")), &e); err != nil {
				t.Fatal(err)
			}
			want := policy.Resolve(all, policy.DefaultPolicy("wireguard"), policy.Cluster{Name: a, Labels: labels[a]}, policy.Cluster{Name: b, Labels: labels[b]})
			if !e.Decision.Equal(want) || e.A != a || e.B != b {
				t.Errorf("explain %s %s: %+v, want %+v", b, a, e.Decision, want)
			}
		}
	}
	tests := []struct {
		name string
		a, b string
		want string
	}{
		{"a pair decided by one policy", "op1", "op2",
			"op1 <-> op2: connect over vxlan (policy on-prem, priority 3); candidates: on-prem (priority 3, connect over vxlan, decided)"},
		{"a pair where no-connect won a conflict", "op1", "cl1",
			"op1 <-> cl1: no connection (policy on-prem-to-cloud-no-connect, priority 3); candidates: on-prem-to-cloud (priority 3, connect over ipsec, lost conflict), on-prem-to-cloud-no-connect (priority 3, no connection, decided)"},
		{"a pair left to the default", "cl2", "op2",
			"cl2 <-> op2: connect over wireguard (default policy default, priority 0); candidates: default (priority 0, connect over wireguard, decided)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if out := cablectlT(t, cfg, "", "connection-policy", "explain", tt.a, tt.b); out != tt.want+"\n" {
				t.Fatalf("explain printed\n%s\nwant\n%s", out, tt.want)
			}
		})
	}
	_, _, err := runCmd(t, "", "--config", cfg, "connection-policy", "explain", "op1", "mars")
	if err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `cluster "mars" not found`) {
		t.Fatalf("explain of an unknown cluster: %v", err)
	}

	// Relabelling a cluster changes the decision.
	cablectlT(t, cfg, "", "cluster", "label", "cl2", "env=production")
	if out := cablectlT(t, cfg, "", "connection-policy", "explain", "op1", "cl2"); !strings.HasPrefix(out, "op1 <-> cl2: no connection (policy on-prem-to-cloud-no-connect") {
		t.Fatalf("after relabelling cl2: %s", out)
	}
}

func TestAddListDeleteAndExportRoundTrip(t *testing.T) {
	cfg := startClusterTestBroker(t)
	seedMesh(t, cfg)
	out := cablectlT(t, cfg, "", "connection-policy", "add", "--name", "db", "--left-cluster-selector", "location=cloud,env!=staging",
		"--right-cluster-selector", "", "--topology", "client-server", "--cable-driver", "vxlan", "--cable-config", "vni=7", "--priority", "5")
	if out != "clusterconnectionpolicy/db created\n" {
		t.Fatalf("add printed %q", out)
	}
	db := listed(t, cfg)["db"]
	if db.Spec.RightClusterSelector == nil || !db.Spec.RightClusterSelector.IsEmpty() || db.Spec.ClusterSelector != nil ||
		db.Spec.CableDriver.Options["vni"] != "7" || db.EffectivePriority() != 5 || db.Status == nil || db.Status.PairsDecided != 6 || db.Status.PairsConnected != 3 {
		// cl1 is the one server and every cluster a client: db covers all 6 pairs, connecting cl1
		// with each of the other three and deciding no-connect for the client-client pairs.
		t.Fatalf("added policy %+v status %+v", db.Spec, db.Status)
	}
	if out := cablectlT(t, cfg, "", "connection-policy", "add", "--name", "db", "--right-cluster-selector", "", "--left-cluster-selector", "location=cloud,env!=staging",
		"--topology", "client-server", "--cable-driver", "vxlan", "--cable-config", "vni=7", "--priority", "5"); out != "clusterconnectionpolicy/db unchanged\n" {
		t.Fatalf("the same add again printed %q", out)
	}
	table := cablectlT(t, cfg, "", "connection-policy", "list")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "db ") ||
		!strings.Contains(lines[1], "location=cloud,env!=staging <-> *") || !strings.HasPrefix(lines[2], "default (default)") {
		t.Fatalf("list:\n%s", table)
	}

	// export | apply -f - reports every policy unchanged.
	exported := cablectlT(t, cfg, "", "connection-policy", "export")
	if out := cablectlT(t, cfg, exported, "apply", "-f", "-"); out != "clusterconnectionpolicy/db unchanged\nclusterconnectionpolicy/default unchanged\n" {
		t.Fatalf("export | apply printed %q; export was:\n%s", out, exported)
	}
	one := cablectlT(t, cfg, "", "connection-policy", "export", "--name", "db")
	if ps, err := policy.DecodeYAML([]byte(one)); err != nil || len(ps) != 1 || ps[0].Metadata.Name != "db" || ps[0].Status != nil {
		t.Fatalf("export --name db: %v %v\n%s", ps, err, one)
	}
	if _, _, err := runCmd(t, "", "--config", cfg, "connection-policy", "export", "nope"); err == nil || !strings.Contains(err.Error(), `policy "nope" not found`) {
		t.Fatalf("export of a missing policy: %v", err)
	}

	// delete -f removes what the file names; the default cannot go.
	file := filepath.Join(t.TempDir(), "db.yaml")
	if err := os.WriteFile(file, []byte(one), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := cablectlT(t, cfg, "", "delete", "-f", file); out != "clusterconnectionpolicy/db deleted\n" {
		t.Fatalf("delete -f printed %q", out)
	}
	if _, ok := listed(t, cfg)["db"]; ok {
		t.Fatal("delete -f left the policy")
	}
	if _, _, err := runCmd(t, "", "--config", cfg, "delete", "-f", file); err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `policy "db" not found`) {
		t.Fatalf("second delete -f: %v, want a failure (exit 1) naming db", err)
	}
	if out := cablectlT(t, cfg, "", "delete", "-f", file, "--ignore-not-found"); out != "" {
		t.Fatalf("delete --ignore-not-found of nothing printed %q", out)
	}
	if _, _, err := runCmd(t, "", "--config", cfg, "delete", "-f", "-"); err == nil || !strings.Contains(err.Error(), "no policies in -") {
		t.Fatalf("delete -f of empty stdin: %v", err)
	}
	_, _, err := runCmd(t, "", "--config", cfg, "connection-policy", "delete", "default")
	if err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), "cannot be deleted") {
		t.Fatalf("delete of the default: %v", err)
	}
	cablectlT(t, cfg, "", "connection-policy", "add", "--name", "tmp", "--cluster-selector", "env=staging", "--connection-policy", "no-connect")
	if out := cablectlT(t, cfg, "", "connection-policy", "delete", "--name", "tmp"); out != "clusterconnectionpolicy/tmp deleted\n" {
		t.Fatalf("delete --name printed %q", out)
	}
}

func TestPolicyCommandsRefuseBadUsageBeforeDialling(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "missing.yaml")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"add without a name", []string{"connection-policy", "add", "--cable-driver", "vxlan"}, "--name is required"},
		{"add with an unknown topology", []string{"connection-policy", "add", "--name", "x", "--topology", "star"}, `spec.topology: "star"`},
		{"add with a bad selector", []string{"connection-policy", "add", "--name", "x", "--cluster-selector", "env in (a"}, "--cluster-selector"},
		{"add mixing the selector forms", []string{"connection-policy", "add", "--name", "x", "--cluster-selector", "a=b", "--left-cluster-selector", "c=d"}, "cannot be used together"},
		{"add of a no-connect policy with a driver", []string{"connection-policy", "add", "--name", "x", "--connection-policy", "no-connect", "--cable-driver", "vxlan"}, "no-connect policy takes no cable driver"},
		{"add with bad cable options", []string{"connection-policy", "add", "--name", "x", "--cable-driver", "vxlan", "--cable-config", "vni"}, "--cable-config"},
		{"add with a non-integer priority", []string{"connection-policy", "add", "--name", "x", "--priority", "high"}, "invalid argument"},
		{"delete without a name", []string{"connection-policy", "delete"}, "needs the policy's name"},
		{"delete of a malformed name", []string{"connection-policy", "delete", "Bad_Name"}, `policy name "Bad_Name"`},
		{"explain with one cluster", []string{"connection-policy", "explain", "east"}, "needs CLUSTER_A and CLUSTER_B"},
		{"explain of a cluster with itself", []string{"connection-policy", "explain", "east", "east"}, "two different clusters"},
		{"list with an unknown output", []string{"connection-policy", "list", "-o", "xml"}, `--output "xml"`},
		{"apply without -f", []string{"apply"}, "needs -f FILE"},
		{"apply reading stdin twice", []string{"apply", "-f", "-", "-f", "-"}, "stdin"},
		{"delete without -f", []string{"delete"}, "needs -f FILE"},
		{"apply with an argument", []string{"apply", "x.yaml"}, "takes no arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runCmd(t, "", append([]string{"--config", cfg}, tt.args...)...)
			if !isClusterUsageErr(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a usage error (exit 2) containing %q", err, tt.want)
			}
		})
	}
	// A file that is not there, or does not decode, is a failure (exit 1), as in kubectl.
	for _, args := range [][]string{{"apply", "-f", "nope.yaml"}, {"delete", "-f", "nope.yaml"}} {
		if _, _, err := runCmd(t, "", append([]string{"--config", cfg}, args...)...); err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), "nope.yaml") {
			t.Fatalf("%v: %v, want a failure naming the file", args, err)
		}
	}
}

func TestPolicyTableGolden(t *testing.T) {
	mk := func(name string, def bool, rev uint64, y string, st policy.Status) *apiv1.Policy {
		ps, err := policy.DecodeYAML([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		ps[0].Origin = policy.OriginMesh
		pj, _ := json.Marshal(&ps[0])
		sj, _ := json.Marshal(st)
		return &apiv1.Policy{Name: name, IsDefault: def, Revision: rev, Json: pj, StatusJson: sj}
	}
	seed := func(f string) string {
		b, err := os.ReadFile(filepath.Join(seedDir, f))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	resp := &apiv1.ListPoliciesResponse{Revision: 12, Policies: []*apiv1.Policy{
		mk("cloud-a-default", false, 8, seed("05-cloud-a-default.yaml"), policy.Status{PairsDecided: 1, PairsConnected: 1}),
		mk("client-server-policy", false, 10, seed("08-client-server-any.yaml"), policy.Status{PairsDecided: 3, PairsConnected: 3}),
		mk("default", true, 1, "kind: ClusterConnectionPolicy\nmetadata: {name: default}\nspec: {topology: full-mesh, priority: 0, connectionPolicy: connect, cableDriver: {name: wireguard}}\n", policy.Status{PairsDecided: 2, PairsConnected: 2}),
		mk("on-prem", false, 6, seed("03-on-prem.yaml"), policy.Status{PairsDecided: 1, PairsConnected: 1}),
		mk("on-prem-to-cloud", false, 7, seed("04-on-prem-to-cloud.yaml"), policy.Status{ConflictsLost: 1, Conflicts: []policy.Conflict{{ClusterA: "cl1", ClusterB: "op1", Winner: "on-prem-to-cloud-no-connect"}}}),
		mk("on-prem-to-cloud-no-connect", false, 9, seed("06-on-prem-to-cloud-no-connect.yaml"), policy.Status{PairsDecided: 1}),
		mk("tuned", false, 11, "kind: ClusterConnectionPolicy\nmetadata: {name: tuned}\nspec: {clusterSelector: {matchExpressions: [{key: gpu, operator: DoesNotExist}]}, priority: 7, cableDriver: {name: vxlan, options: {vni: '200', mtu: '1400'}}}\n", policy.Status{}),
		mk("lazy", false, 13, "kind: ClusterConnectionPolicy\nmetadata: {name: lazy}\nspec: {leftClusterSelector: {env: '!production'}, priority: 1}\n", policy.Status{PairsDecided: 4, PairsConnected: 4}),
	}}
	// A policy applied in cluster op1, as its agent syncs it.
	local, err := policy.ClusterScoped(policy.ClusterConnectionPolicy{Kind: policy.Kind,
		Metadata: policy.ObjectMeta{Name: "op1-to-cl1", Labels: map[string]string{policy.LabelOrigin: policy.OriginClusterLabel}},
		Spec:     policy.Spec{LeftClusterSelector: &policy.Selector{MatchLabels: map[string]string{"name": "cl1"}}, CableDriver: &policy.CableDriver{Name: "vxlan"}}}, "op1")
	if err != nil {
		t.Fatal(err)
	}
	lj, _ := json.Marshal(&local)
	resp.Policies = append(resp.Policies, &apiv1.Policy{Name: local.Metadata.Name, Revision: 14, Json: lj, StatusJson: []byte(`{"pairsDecided":1,"pairsConnected":1}`)})
	var buf bytes.Buffer
	if err := printPolicies(&buf, "table", resp); err != nil {
		t.Fatal(err)
	}
	golden(t, "policy-list.golden", buf.Bytes())
}
