package cablectl

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/api/jointoken"
	"github.com/cablemesh/cablemesh/deploy"
)

func docsByKind(t *testing.T, out string) map[string][]deploy.Object {
	t.Helper()
	objs, err := deploy.DecodeDocs([]byte(out))
	if err != nil {
		t.Fatalf("the output is not YAML: %v\n%s", err, out)
	}
	m := map[string][]deploy.Object{}
	for _, o := range objs {
		k, _ := o["kind"].(string)
		m[k] = append(m[k], o)
	}
	return m
}

func TestInstallKubernetesAgainstARealBroker(t *testing.T) {
	admin := startClusterTestBroker(t)
	out, stderr, err := runCmd(t, "", "install", "kubernetes", "--config", admin, "--cluster", "east",
		"--pod-cidr", "10.1.0.0/16", "--service-cidr", "10.101.0.0/16", "--labels", "env=prod", "--gateway-nodes", "role=gw")
	if err != nil {
		t.Fatalf("install: %v\n%s", err, stderr)
	}
	// admin.yaml names the loopback broker of the test: the agents could not reach it.
	if !strings.Contains(stderr, "loopback") {
		t.Errorf("no warning about a loopback broker address on stderr: %q", stderr)
	}
	m := docsByKind(t, out)
	if len(m["Secret"]) != 1 || len(m["DaemonSet"]) != 2 || len(m["CustomResourceDefinition"]) != 4 || len(m["ClusterRole"]) != 3 {
		t.Fatalf("output lacks objects: %d Secret, %d DaemonSet, %d CRD, %d ClusterRole", len(m["Secret"]), len(m["DaemonSet"]), len(m["CustomResourceDefinition"]), len(m["ClusterRole"]))
	}
	data := m["Secret"][0]["data"].(map[string]any)[deploy.SecretKey].(string)
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jointoken.Decode(string(raw))
	if err != nil || claims.Cluster != "east" {
		t.Fatalf("the Secret holds no join token for east: %+v %v", claims, err)
	}
	ds := m["DaemonSet"][0]["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	if sel := ds["nodeSelector"].(map[string]any); sel["role"] != "gw" {
		t.Errorf("nodeSelector %v, want role=gw from --gateway-nodes", sel)
	}
	cm := m["ConfigMap"][0]["data"].(map[string]any)[deploy.ConfigMapKey].(string)
	for _, want := range []string{`cluster: "east"`, `podCIDRs: ["10.1.0.0/16"]`, `serviceCIDRs: ["10.101.0.0/16"]`, `broker: "127.0.0.1:`} {
		if !strings.Contains(cm, want) {
			t.Errorf("agent config lacks %q:\n%s", want, cm)
		}
	}

	// The cluster now exists at the broker, with its CIDRs and labels.
	list, err := runClusterCmd(t, "cluster", "list", "--config", admin, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var lv clusterListView
	if err := json.Unmarshal([]byte(list), &lv); err != nil {
		t.Fatal(err)
	}
	if len(lv.Clusters) != 1 || lv.Clusters[0].Name != "east" || lv.Clusters[0].Labels["env"] != "prod" || lv.Clusters[0].PodCIDRs[0] != "10.1.0.0/16" {
		t.Errorf("the broker does not hold east as installed: %+v", lv.Clusters)
	}

	// A second install for more nodes is allowed with the same CIDRs, and refused with others,
	// by the broker, as for join-token.
	if _, _, err := runCmd(t, "", "install", "kubernetes", "--config", admin, "--cluster", "east", "--pod-cidr", "10.9.0.0/16", "--agent-broker", "192.0.2.1:7443"); err == nil {
		t.Errorf("a second install with other pod CIDRs was accepted")
	}
	if out, _, err := runCmd(t, "", "install", "kubernetes", "--config", admin, "--cluster", "east", "--pod-cidr", "10.1.0.0/16", "--service-cidr", "10.101.0.0/16", "--agent-broker", "192.0.2.1:7443"); err != nil {
		t.Errorf("a second install with the same CIDRs: %v", err)
	} else if !strings.Contains(out, `broker: "192.0.2.1:7443"`) {
		t.Errorf("--agent-broker is not the agents' broker address")
	}

	// --gateway-mode creates gateway-mode clusters, which may share a pod CIDR; a direct one may
	// not take it, and the broker's refusal says why.
	for _, c := range []string{"west", "north"} {
		if _, stderr, err := runCmd(t, "", "install", "kubernetes", "--config", admin, "--cluster", c, "--pod-cidr", "10.50.0.0/16", "--gateway-mode", "--agent-broker", "192.0.2.1:7443"); err != nil {
			t.Fatalf("install %s in gateway mode: %v\n%s", c, err, stderr)
		}
	}
	if _, _, err := runCmd(t, "", "install", "kubernetes", "--config", admin, "--cluster", "south", "--pod-cidr", "10.50.0.0/16", "--agent-broker", "192.0.2.1:7443"); err == nil || !strings.Contains(err.Error(), "--gateway-mode") {
		t.Errorf("a direct cluster over a gateway-mode one's CIDR: %v, want a refusal hinting --gateway-mode", err)
	}
	if _, _, err := runCmd(t, "", "install", "kubernetes", "--config", admin, "--cluster", "west", "--pod-cidr", "10.50.0.0/16", "--agent-broker", "192.0.2.1:7443"); err == nil || !strings.Contains(err.Error(), "gateway mode") {
		t.Errorf("re-install of a gateway-mode cluster without --gateway-mode: %v, want a refusal naming the mode", err)
	}
	list, err = runClusterCmd(t, "cluster", "list", "--config", admin, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	lv = clusterListView{}
	if err := json.Unmarshal([]byte(list), &lv); err != nil {
		t.Fatal(err)
	}
	modes := map[string]bool{}
	for _, c := range lv.Clusters {
		modes[c.Name] = c.GatewayMode
	}
	if fmt.Sprint(modes) != "map[east:false north:true west:true]" {
		t.Errorf("cluster modes %v; want east direct, north and west gateway", modes)
	}
}

func TestInstallKubernetesUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no cluster", []string{"--pod-cidr", "10.1.0.0/16"}, "--cluster is required"},
		{"no pod CIDR", []string{"--cluster", "east"}, "--pod-cidr is required"},
		{"a bad pod CIDR", []string{"--cluster", "east", "--pod-cidr", "10.1.0.0/40"}, "10.1.0.0/40"},
		{"a bad cluster name", []string{"--cluster", "East", "--pod-cidr", "10.1.0.0/16"}, "East"},
		{"a bad gateway selector", []string{"--cluster", "east", "--pod-cidr", "10.1.0.0/16", "--agent-broker", "b.example:7443", "--gateway-nodes", "zone in (a"}, "gateway nodes selector"},
		{"a bad agent broker", []string{"--cluster", "east", "--pod-cidr", "10.1.0.0/16", "--agent-broker", "b.example"}, `broker address "b.example"`},
		{"an argument", []string{"east"}, "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// No broker is running: usage errors come before any call.
			_, _, err := runCmd(t, "", append([]string{"install", "kubernetes", "--config", "/nonexistent/admin.yaml"}, tt.args...)...)
			if err == nil || !isClusterUsageErr(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want a usage error (exit 2) naming %q", err, tt.want)
			}
		})
	}
	// A broker that is not there is a failure (exit 1), not bad usage.
	_, _, err := runCmd(t, "", "install", "kubernetes", "--config", "/nonexistent/admin.yaml", "--cluster", "east", "--pod-cidr", "10.1.0.0/16", "--agent-broker", "b.example:7443")
	if err == nil || isClusterUsageErr(err) {
		t.Errorf("a missing admin config: %v, want a failure (exit 1)", err)
	}
}

func TestUninstallKubernetes(t *testing.T) {
	out, _, err := runCmd(t, "", "uninstall", "kubernetes", "--cluster", "east")
	if err != nil {
		t.Fatal(err)
	}
	m := docsByKind(t, out)
	if len(m["CustomResourceDefinition"]) != 0 {
		t.Errorf("uninstall deletes the CRDs without --include-crds")
	}
	// The agent's grants, the service-import writer's (cablemesh-service-imports) and the status
	// writer's (cablemesh-kube-status).
	if len(m["DaemonSet"]) != 2 || len(m["Namespace"]) != 1 || len(m["ClusterRole"]) != 3 || len(m["ClusterRoleBinding"]) != 3 ||
		len(m["Role"]) != 2 || len(m["RoleBinding"]) != 2 || len(m["Secret"]) != 1 {
		t.Errorf("uninstall leaves objects behind: %v", deploy.SortedKinds(flatten(m)))
	}
	// The DaemonSets go first, while the agents can still read them; the namespace last.
	objs, err := deploy.DecodeDocs([]byte(out))
	if err != nil || len(objs) == 0 || objs[0]["kind"] != "DaemonSet" || objs[len(objs)-1]["kind"] != "Namespace" {
		t.Errorf("uninstall order %v: want the DaemonSets first and the Namespace last", objs)
	}
	if _, ok := m["Secret"][0]["data"]; ok {
		t.Errorf("uninstall prints a Secret's data")
	}
	out, _, err = runCmd(t, "", "uninstall", "kubernetes", "--cluster", "east", "--include-crds")
	if err != nil || len(docsByKind(t, out)["CustomResourceDefinition"]) != 4 {
		t.Errorf("--include-crds: %v, %d CRDs", err, len(docsByKind(t, out)["CustomResourceDefinition"]))
	}
	if _, _, err := runCmd(t, "", "uninstall", "kubernetes"); err == nil || !isClusterUsageErr(err) {
		t.Errorf("uninstall without --cluster: %v, want a usage error", err)
	}
}

func flatten(m map[string][]deploy.Object) []deploy.Object {
	var out []deploy.Object
	for _, v := range m {
		out = append(out, v...)
	}
	return out
}
