// Package helm tests the chart deploy/helm/cablemesh with Helm's own packages (helm.sh/helm/v3,
// `helm template`'s code path): a module of its own, so neither the project's go.mod nor any of
// its binaries depends on Helm.
package helm

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/deploy"
)

const chartDir = "../../deploy/" + deploy.HelmChartDir

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load %s: %v", chartDir, err)
	}
	return c
}

// helmTemplate renders the chart as `helm template --include-crds` does.
func helmTemplate(t *testing.T, values map[string]any) ([]deploy.Object, error) {
	t.Helper()
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.IncludeCRDs = true
	install.ReleaseName = "cablemesh"
	install.Namespace = "default"
	rel, err := install.Run(loadChart(t), values)
	if err != nil {
		return nil, err
	}
	objs, err := deploy.DecodeDocs([]byte(rel.Manifest))
	if err != nil {
		t.Fatalf("decode helm's output: %v\n%s", err, rel.Manifest)
	}
	return objs, nil
}

// cablectlObjects is what `cablectl install kubernetes` prints for v, decoded as helm's output is.
func cablectlObjects(t *testing.T, v deploy.AgentValues) []deploy.Object {
	t.Helper()
	out, err := deploy.AgentManifests(v)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.DecodeDocs(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// chartValues are the chart's values for the install's settings v (the chart's join token is a
// Secret made beforehand, so v.JoinToken has no counterpart).
func chartValues(t *testing.T, v deploy.AgentValues) map[string]any {
	t.Helper()
	vals := map[string]any{"cluster": v.Cluster, "broker": v.Broker, "podCIDRs": v.PodCIDRs}
	if len(v.ServiceCIDRs) > 0 {
		vals["serviceCIDRs"] = v.ServiceCIDRs
	}
	if v.GatewayNodes != "" {
		sel := map[string]any{}
		for _, kv := range strings.Split(v.GatewayNodes, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("gateway nodes %q: the chart's nodeSelector takes k=v requirements only", v.GatewayNodes)
			}
			sel[k] = val
		}
		vals["gateway"] = map[string]any{"nodeSelector": sel}
	}
	image := func(ref string) map[string]any {
		i := strings.LastIndex(ref, ":")
		return map[string]any{"repository": ref[:i], "tag": ref[i+1:]}
	}
	if v.Image != "" {
		vals["image"] = image(v.Image)
	}
	envoy := map[string]any{"enabled": v.IngressEnvoy}
	if v.EnvoyImage != "" {
		envoy["image"] = image(v.EnvoyImage)
	}
	vals["ingress"] = map[string]any{"envoy": envoy}
	// As from a values file: lists are []any, numbers float64.
	b, err := json.Marshal(vals)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func key(o deploy.Object) string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%v/%v/%v", o["kind"], md["namespace"], md["name"])
}

func byKey(objs []deploy.Object) map[string]deploy.Object {
	m := map[string]deploy.Object{}
	for _, o := range objs {
		m[key(o)] = o
	}
	return m
}

// sameObjects reports every object missing on one side or different, with both as YAML.
func sameObjects(t *testing.T, helm, cablectl []deploy.Object) {
	t.Helper()
	h, c := byKey(helm), byKey(cablectl)
	if len(h) != len(helm) || len(c) != len(cablectl) {
		t.Errorf("an object twice: helm %d objects, %d distinct; cablectl %d, %d", len(helm), len(h), len(cablectl), len(c))
	}
	for _, k := range slices.Sorted(maps.Keys(c)) {
		ho, ok := h[k]
		if !ok {
			t.Errorf("%s: cablectl renders it, the chart does not", k)
			continue
		}
		hy, _ := yaml.Marshal(ho)
		cy, _ := yaml.Marshal(c[k])
		if string(hy) != string(cy) {
			t.Errorf("%s differs:\n--- helm template\n%s\n--- cablectl install kubernetes\n%s", k, hy, cy)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if _, ok := c[k]; !ok {
			t.Errorf("%s: the chart renders it, cablectl does not", k)
		}
	}
}

// The install's settings the chart must render identically.
var settings = []struct {
	name string
	v    deploy.AgentValues
}{
	{"defaults", deploy.AgentValues{Cluster: "east", Broker: "broker.example.internal:7443", PodCIDRs: []string{"10.1.0.0/16"}}},
	{"service CIDRs, two pod CIDRs, IPv6, broker replicas", deploy.AgentValues{Cluster: "west", Broker: "10.0.0.1:7443,[fd00::1]:7443",
		PodCIDRs: []string{"10.2.0.0/16", "fd00:2::/56"}, ServiceCIDRs: []string{"10.96.2.0/24", "fd00:96::/108"}}},
	{"gateway nodes by two labels", deploy.AgentValues{Cluster: "edge-1", Broker: "broker:7443", PodCIDRs: []string{"10.3.0.0/16"},
		GatewayNodes: "node-role.example.com/edge=yes,topology.kubernetes.io/zone=a"}},
	{"own image", deploy.AgentValues{Cluster: "east", Broker: "broker:7443", PodCIDRs: []string{"10.1.0.0/16"},
		Image: "registry.example:5000/team/cable-agent:v9.1"}},
	{"Envoy ingress", deploy.AgentValues{Cluster: "east", Broker: "broker:7443", PodCIDRs: []string{"10.1.0.0/16"},
		IngressEnvoy: true, EnvoyImage: "mirror.example/envoyproxy/envoy:v1.35.0"}},
	{"a cluster named like a number", deploy.AgentValues{Cluster: "123", Broker: "broker:7443", PodCIDRs: []string{"10.1.0.0/16"},
		IngressEnvoy: true}},
}

// TestHelmTemplateIsTheInstall: for each setting, `helm template --include-crds` of the chart
// renders exactly the objects `cablectl install kubernetes` prints (its Secret aside: the chart
// mounts an existing one of the same name).
func TestHelmTemplateIsTheInstall(t *testing.T) {
	for _, s := range settings {
		t.Run(s.name, func(t *testing.T) {
			helm, err := helmTemplate(t, chartValues(t, s.v))
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			sameObjects(t, helm, cablectlObjects(t, s.v))
		})
	}
}

func defaultValues() map[string]any {
	return map[string]any{"cluster": "east", "broker": "broker:7443", "podCIDRs": []any{"10.1.0.0/16"}}
}

func daemonSet(t *testing.T, objs []deploy.Object, name string) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objs {
		if key(o) == "DaemonSet/"+deploy.Namespace+"/"+name {
			b, _ := yaml.Marshal(o)
			var ds appsv1.DaemonSet
			if err := yaml.UnmarshalStrict(b, &ds); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return &ds
		}
	}
	return nil
}

func agentConfigText(t *testing.T, objs []deploy.Object, key string) string {
	t.Helper()
	for _, o := range objs {
		if o["kind"] == "ConfigMap" && o["metadata"].(map[string]any)["name"] == deploy.ConfigMapName {
			return o["data"].(map[string]any)[key].(string)
		}
	}
	t.Fatal("no agent ConfigMap")
	return ""
}

// TestChartOnlyValues: the values cablectl has no flag for reach the objects they name, and
// nothing else changes.
func TestChartOnlyValues(t *testing.T) {
	base, err := helmTemplate(t, defaultValues())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("workers off", func(t *testing.T) {
		v := defaultValues()
		v["workers"] = map[string]any{"enabled": false}
		objs, err := helmTemplate(t, v)
		if err != nil {
			t.Fatal(err)
		}
		if daemonSet(t, objs, deploy.WorkerDaemonSetName) != nil || daemonSet(t, objs, deploy.DaemonSetName) == nil {
			t.Errorf("workers.enabled false: want the gateways' DaemonSet and no %s", deploy.WorkerDaemonSetName)
		}
		if len(objs) != len(base)-1 {
			t.Errorf("workers.enabled false: %d objects, want %d (one less)", len(objs), len(base)-1)
		}
	})
	t.Run("an empty gateway selector is the default one, a given one replaces it", func(t *testing.T) {
		v := defaultValues()
		v["gateway"] = map[string]any{"nodeSelector": map[string]any{}}
		objs, err := helmTemplate(t, v)
		if err != nil {
			t.Fatal(err)
		}
		sameObjects(t, objs, base)
		v["gateway"] = map[string]any{"nodeSelector": map[string]any{"role": "edge"}}
		if objs, err = helmTemplate(t, v); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"kubernetes.io/os": "linux", "role": "edge"}
		if got := daemonSet(t, objs, deploy.DaemonSetName).Spec.Template.Spec.NodeSelector; !maps.Equal(got, want) {
			t.Errorf("gateway.nodeSelector {role: edge}: the gateways' nodeSelector %v, want %v (the default label replaced)", got, want)
		}
	})
	t.Run("existing Secret with another key", func(t *testing.T) {
		v := defaultValues()
		v["joinToken"] = map[string]any{"existingSecret": "east-token", "key": "token"}
		objs, err := helmTemplate(t, v)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{deploy.DaemonSetName, deploy.WorkerDaemonSetName} {
			ds := daemonSet(t, objs, name)
			i := slices.IndexFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "join-token" })
			s := ds.Spec.Template.Spec.Volumes[i].Secret
			want := []corev1.KeyToPath{{Key: "token", Path: deploy.SecretKey}}
			if s == nil || s.SecretName != "east-token" || !slices.Equal(s.Items, want) || s.DefaultMode == nil || *s.DefaultMode != 0o400 {
				t.Errorf("%s: join-token volume %+v, want Secret east-token, key token as file %s, mode 0400", name, s, deploy.SecretKey)
			}
		}
	})
	t.Run("tolerations, resources, pull policy, drivers", func(t *testing.T) {
		v := defaultValues()
		v["tolerations"] = []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "edge", "effect": "NoExecute"}}
		v["resources"] = map[string]any{"requests": map[string]any{"cpu": "100m"}, "limits": map[string]any{"memory": "512Mi"}}
		v["image"] = map[string]any{"repository": "cablemesh/cable-agent", "tag": "v0.1.0", "pullPolicy": "Always"}
		v["cableDrivers"] = []any{"wireguard", "ipsec"}
		objs, err := helmTemplate(t, v)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{deploy.DaemonSetName, deploy.WorkerDaemonSetName} {
			ps := daemonSet(t, objs, name).Spec.Template.Spec
			if len(ps.Tolerations) != 1 || ps.Tolerations[0].Key != "dedicated" || ps.Tolerations[0].Effect != corev1.TaintEffectNoExecute {
				t.Errorf("%s: tolerations %+v", name, ps.Tolerations)
			}
			c := ps.Containers[0]
			if c.Resources.Requests.Cpu().String() != "100m" || c.Resources.Limits.Memory().String() != "512Mi" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("%s: resources %+v, pull policy %s", name, c.Resources, c.ImagePullPolicy)
			}
		}
		var cfg struct {
			CableDrivers []string `json:"cableDrivers"`
		}
		if err := yaml.Unmarshal([]byte(agentConfigText(t, objs, deploy.ConfigMapKey)), &cfg); err != nil || !slices.Equal(cfg.CableDrivers, []string{"wireguard", "ipsec"}) {
			t.Errorf("gateways' cableDrivers %v (%v), want [wireguard ipsec]", cfg.CableDrivers, err)
		}
	})
}

// TestChartRefusesBadValues: a bad value fails the render with an error naming it.
func TestChartRefusesBadValues(t *testing.T) {
	tests := []struct {
		name   string
		change func(v map[string]any)
		want   []string // each in the error
	}{
		{"no cluster", func(v map[string]any) { delete(v, "cluster") }, []string{"cluster"}},
		{"cluster not a DNS label", func(v map[string]any) { v["cluster"] = "East_1" }, []string{"cluster", "East_1"}},
		{"no broker", func(v map[string]any) { v["broker"] = "" }, []string{"broker"}},
		{"broker without port", func(v map[string]any) { v["broker"] = "broker.example" }, []string{"broker", "broker.example"}},
		{"broker port out of range", func(v map[string]any) { v["broker"] = "broker:70000" }, []string{"broker", "70000"}},
		{"no pod CIDR", func(v map[string]any) { v["podCIDRs"] = []any{} }, []string{"podCIDRs"}},
		{"pod CIDR not a CIDR", func(v map[string]any) { v["podCIDRs"] = []any{"10.1.0.0/33"} }, []string{"podCIDRs", "10.1.0.0/33"}},
		{"service CIDR not a CIDR", func(v map[string]any) { v["serviceCIDRs"] = []any{"ten"} }, []string{"serviceCIDRs", "ten"}},
		{"unknown driver", func(v map[string]any) { v["cableDrivers"] = []any{"gre"} }, []string{"/cableDrivers/0", "wireguard"}},
		{"image tag with a blank", func(v map[string]any) {
			v["image"] = map[string]any{"repository": "cablemesh/cable-agent", "tag": "v 1", "pullPolicy": "IfNotPresent"}
		}, []string{"image", "tag"}},
		{"pull policy", func(v map[string]any) {
			v["image"] = map[string]any{"repository": "cablemesh/cable-agent", "tag": "v1", "pullPolicy": "Sometimes"}
		}, []string{"/image/pullPolicy", "IfNotPresent"}},
		{"gateway label key", func(v map[string]any) {
			v["gateway"] = map[string]any{"nodeSelector": map[string]any{"-bad": "x"}}
		}, []string{"/gateway/nodeSelector", "-bad"}},
		{"gateway label value not a string", func(v map[string]any) {
			v["gateway"] = map[string]any{"nodeSelector": map[string]any{"cablemesh.io/gateway": true}}
		}, []string{"nodeSelector", "cablemesh.io~1gateway"}},
		{"gateway selector on the OS", func(v map[string]any) {
			v["gateway"] = map[string]any{"nodeSelector": map[string]any{"kubernetes.io/os": "linux"}}
		}, []string{"gateway.nodeSelector", "kubernetes.io/os"}},
		{"Secret key", func(v map[string]any) { v["joinToken"] = map[string]any{"existingSecret": "t", "key": "a/b"} }, []string{"joinToken", "key", "a/b"}},
		{"unknown value", func(v map[string]any) { v["brokr"] = "x:1" }, []string{"brokr"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := defaultValues()
			tt.change(v)
			_, err := helmTemplate(t, v)
			if err == nil {
				t.Fatalf("values %v rendered", v)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}
