package deploy

import (
	"testing"

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
			cm, ok := obj.(*corev1.ConfigMap)
			if !ok || cm.Name != ConfigMapName {
				continue
			}
			var cfg map[string]any
			if err := yaml.Unmarshal([]byte(cm.Data[ConfigMapKey]), &cfg); err != nil {
				t.Fatalf("agent config is not YAML: %v", err)
			}
			if cfg["cluster"] != cluster || cfg["broker"] != broker {
				t.Fatalf("agent config says cluster %v broker %v, given %q %q", cfg["cluster"], cfg["broker"], cluster, broker)
			}
		}
	})
}
