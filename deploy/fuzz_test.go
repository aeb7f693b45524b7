package deploy

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// FuzzAgentManifests feeds the install's outside input (cluster name, broker address, pod CIDR,
// gateway node selector) to the renderer: it must refuse it or print manifests that decode
// strictly, whose agent config says exactly what was given (nothing injected into the YAML).
func FuzzAgentManifests(f *testing.F) {
	f.Add("east", "broker.example:7443", "10.1.0.0/16", "cablemesh.io/gateway=true")
	f.Add("west", "192.0.2.1:7443,[2001:db8::1]:7443", "fd00::/64", "role in (a,b),!spot,zone!=c")
	f.Add("a", "b:1\nlogLevel: debug", "10.0.0.0/8", "x")
	f.Add("east", "host:7443", "10.1.0.0/16", "k>3")
	f.Add("null", "host:7443", "10.1.0.0/16", "k")
	f.Add("123", "host:7443", "10.1.0.0/16", "k")
	f.Fuzz(func(t *testing.T, cluster, broker, pod, selector string) {
		v := AgentValues{Cluster: cluster, Broker: broker, PodCIDRs: []string{pod}, GatewayNodes: selector, JoinToken: "tok"}
		out, err := AgentManifests(v)
		if err != nil {
			return
		}
		dec := decoder(t)
		docs, err := DecodeDocs(out)
		if err != nil {
			t.Fatalf("output does not parse: %v", err)
		}
		for _, d := range docs {
			raw, _ := yaml.Marshal(d)
			obj, _, err := dec.Decode(raw, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", kindName(d), err)
			}
			if ds, ok := obj.(*appsv1.DaemonSet); ok && ds.Name == WorkerDaemonSetName {
				a := ds.Spec.Template.Spec.Affinity
				if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
					len(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
					t.Fatalf("selector %q: the worker DaemonSet has no node affinity: it would run on the gateways too", selector)
				}
			}
			cm, ok := obj.(*corev1.ConfigMap)
			if !ok || cm.Name != ConfigMapName {
				continue
			}
			for key, gateway := range map[string]bool{ConfigMapKey: true, WorkerConfigKey: false} {
				var cfg map[string]any
				if err := yaml.Unmarshal([]byte(cm.Data[key]), &cfg); err != nil {
					t.Fatalf("agent config %s is not YAML: %v", key, err)
				}
				if cfg["cluster"] != cluster || cfg["broker"] != broker || cfg["gateway"] != gateway {
					t.Fatalf("agent config %s says cluster %v broker %v gateway %v, given %q %q", key, cfg["cluster"], cfg["broker"], cfg["gateway"], cluster, broker)
				}
			}
		}
	})
}
