package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// discoveryServer is the least of an API server kubectl apply --dry-run=client needs: discovery
// (kubectl maps every kind to its resource first, even for a client-side dry run) and a 404 for
// every object it looks up, i.e. an empty cluster. It validates nothing itself: what it checks
// is that kubectl parses every document and knows every kind and scope.
func discoveryServer(t *testing.T) *httptest.Server {
	t.Helper()
	res := func(name, kind string, namespaced bool) metav1.APIResource {
		return metav1.APIResource{Name: name, Kind: kind, Namespaced: namespaced, Verbs: metav1.Verbs{"get", "list", "create", "update", "patch", "delete"}}
	}
	groups := map[string][]metav1.APIResource{
		"v1": {res("namespaces", "Namespace", false), res("serviceaccounts", "ServiceAccount", true), res("configmaps", "ConfigMap", true),
			res("secrets", "Secret", true), res("services", "Service", true), res("persistentvolumeclaims", "PersistentVolumeClaim", true)},
		"apps/v1":                      {res("daemonsets", "DaemonSet", true), res("deployments", "Deployment", true)},
		"rbac.authorization.k8s.io/v1": {res("clusterroles", "ClusterRole", false), res("clusterrolebindings", "ClusterRoleBinding", false),
			res("roles", "Role", true), res("rolebindings", "RoleBinding", true)},
		"apiextensions.k8s.io/v1":      {res("customresourcedefinitions", "CustomResourceDefinition", false)},
	}
	write := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/api", func(w http.ResponseWriter, _ *http.Request) {
		write(w, 200, metav1.APIVersions{TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"}})
	})
	mux.HandleFunc("/apis", func(w http.ResponseWriter, _ *http.Request) {
		list := metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}}
		for gv := range groups {
			g, v, ok := strings.Cut(gv, "/")
			if !ok {
				continue
			}
			gvd := metav1.GroupVersionForDiscovery{GroupVersion: gv, Version: v}
			list.Groups = append(list.Groups, metav1.APIGroup{Name: g, Versions: []metav1.GroupVersionForDiscovery{gvd}, PreferredVersion: gvd})
		}
		write(w, 200, list)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/apis/"), "/api/")
		if rs, ok := groups[p]; ok {
			write(w, 200, metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: p, APIResources: rs})
			return
		}
		write(w, 404, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure", Reason: metav1.StatusReasonNotFound, Code: 404, Message: r.URL.Path + " not found"})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// kubectlApplyDryRun runs `kubectl apply --dry-run=client --validate=false -f -` on data against
// the discovery server and returns its output.
func kubectlApplyDryRun(t *testing.T, data []byte, verb ...string) string {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed (Debian: apt-get install kubernetes-client); the decode tests still check every object")
	}
	srv := discoveryServer(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters: [{name: fake, cluster: {server: " + srv.URL + "}}]\n" +
		"users: [{name: fake, user: {}}]\ncontexts: [{name: fake, context: {cluster: fake, user: fake}}]\ncurrent-context: fake\n"
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if len(verb) == 0 {
		verb = []string{"apply"}
	}
	args := append(verb, "--dry-run=client", "--validate=false", "-f", "-")
	cmd := exec.CommandContext(ctx, kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "HOME="+t.TempDir())
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s refused the manifests: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestKubectlAppliesTheInstallOutput(t *testing.T) {
	out, err := AgentManifests(installValues)
	if err != nil {
		t.Fatal(err)
	}
	got := kubectlApplyDryRun(t, out)
	objs := mustDocs(t, out)
	// kubectl prints one "<resource>/<name> created (dry run)" line per object.
	if n := strings.Count(got, "created (dry run)"); n != len(objs) {
		t.Errorf("kubectl created %d objects, the output has %d:\n%s", n, len(objs), got)
	}
	for _, want := range []string{"daemonset.apps/cable-agent", "secret/cable-join-token", "customresourcedefinition.apiextensions.k8s.io/clusterconnectionpolicies.cablemesh.io"} {
		if !strings.Contains(got, want) {
			t.Errorf("kubectl did not create %s:\n%s", want, got)
		}
	}
}

func TestKubectlAppliesTheBrokerManifests(t *testing.T) {
	var all []byte
	files, _ := filepath.Glob(filepath.Join("broker", "*.yaml"))
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(append(all, "---\n"...), data...)
	}
	got := kubectlApplyDryRun(t, all)
	if n := strings.Count(got, "created (dry run)"); n != len(mustDocs(t, all)) {
		t.Errorf("kubectl created %d objects of %d:\n%s", n, len(mustDocs(t, all)), got)
	}
}

// TestKustomizeBuildsEveryObject: `kubectl kustomize` (kustomize built into kubectl) reads both
// kustomizations and yields exactly the objects of their files.
func TestKustomizeBuildsEveryObject(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed (Debian: apt-get install kubernetes-client)")
	}
	for dir, parts := range map[string][]string{"daemonset": {"crds", "daemonset"}, "broker": {"broker"}} {
		t.Run(dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, kubectl, "kustomize", dir).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			var want []Object
			for _, p := range parts {
				d, err := Docs(p)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, d...)
			}
			if got, want := SortedKinds(mustDocs(t, out)), SortedKinds(want); !slices.Equal(got, want) {
				t.Errorf("kustomize built %q, the files hold %q", got, want)
			}
		})
	}
}
