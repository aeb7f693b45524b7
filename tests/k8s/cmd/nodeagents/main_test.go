package main

import (
	"bytes"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// install is the shape of `cablectl install kubernetes` output that nodeagents edits.
const install = `apiVersion: v1
kind: Namespace
metadata: {name: cablemesh}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cable-agent-config, namespace: cablemesh, labels: {app.kubernetes.io/name: cable-agent}}
data:
  agent.yaml: |
    cluster: "east"
    gateway: true
    cgroupPath: /host/sys/fs/cgroup
    kubernetes: {enabled: true}
  agent-worker.yaml: |
    cluster: "east"
    gateway: false
    cgroupPath: /host/sys/fs/cgroup
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: cable-agent, namespace: cablemesh, labels: {app.kubernetes.io/name: cable-agent}}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: cable-agent}}
  template:
    metadata: {labels: {app.kubernetes.io/name: cable-agent}}
    spec:
      nodeSelector: {kubernetes.io/os: linux, cablemesh.io/gateway: "true"}
      containers: [{name: cable-agent, image: cablemesh/cable-agent:v0.1.0}]
      volumes:
      - {name: config, configMap: {name: cable-agent-config}}
      - {name: token, secret: {secretName: cable-join-token}}
`

func run(t *testing.T, in string, cgroupPath, dnsListen string) []object {
	t.Helper()
	objs, err := decode(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	objs, err = adapt(objs, cgroupPath, dnsListen)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := encode(&buf, objs); err != nil {
		t.Fatal(err)
	}
	again, err := decode(&buf)
	if err != nil {
		t.Fatalf("the output does not decode: %v", err)
	}
	return again
}

func find(objs []object, kind, name string) object {
	for _, o := range objs {
		if named(o, kind, name) {
			return o
		}
	}
	return nil
}

func agentConfig(t *testing.T, cm object, key string) map[string]any {
	t.Helper()
	if cm == nil {
		t.Fatal("ConfigMap missing")
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm["data"].(map[string]any)[key].(string)), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestWithoutFlagsOnlyTheConfigIsReencoded(t *testing.T) {
	objs := run(t, install, "", "")
	if len(objs) != 3 {
		t.Fatalf("%d objects, want the 3 given", len(objs))
	}
	cfg := agentConfig(t, find(objs, "ConfigMap", configMapName), configKey)
	if cfg["cgroupPath"] != "/host/sys/fs/cgroup" || cfg["gateway"] != true || cfg["dns"] != nil {
		t.Errorf("config changed without a flag: %v", cfg)
	}
}

func TestCgroupPathAndDNSListenInBothConfigs(t *testing.T) {
	objs := run(t, install, "/host/sys/fs/cgroup/unified", "0.0.0.0:53")
	if len(objs) != 3 {
		t.Fatalf("%d objects, want the 3 given (the install renders the workers itself)", len(objs))
	}
	for key, gateway := range map[string]bool{configKey: true, workerConfigKey: false} {
		cfg := agentConfig(t, find(objs, "ConfigMap", configMapName), key)
		if cfg["cgroupPath"] != "/host/sys/fs/cgroup/unified" {
			t.Errorf("%s: cgroupPath %v", key, cfg["cgroupPath"])
		}
		if dns, _ := cfg["dns"].(map[string]any); dns["listen"] != "0.0.0.0:53" {
			t.Errorf("%s: dns %v", key, cfg["dns"])
		}
		if cfg["gateway"] != gateway || cfg["cluster"] != "east" {
			t.Errorf("%s: the rest changed: %v", key, cfg)
		}
	}
}

func TestBadInputIsAnErrorNotAPanic(t *testing.T) {
	for _, in := range []string{
		"kind: ConfigMap\nmetadata: {name: cable-agent-config}\ndata: {agent.yaml: '[1, 2'}\n",
		"kind: ConfigMap\nmetadata: {name: cable-agent-config}\ndata: {agent-worker.yaml: '{a'}\n",
		"- a\n- b\n",
	} {
		objs, err := decode(strings.NewReader(in))
		if err == nil {
			_, err = adapt(objs, "/x", "")
		}
		if err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func FuzzAdapt(f *testing.F) {
	f.Add(install)
	f.Add("kind: DaemonSet\nmetadata: {name: cable-agent}\nspec: {template: {metadata: {labels: {}}, spec: {volumes: [1]}}}\n")
	f.Fuzz(func(t *testing.T, in string) {
		objs, err := decode(strings.NewReader(in))
		if err != nil {
			return
		}
		if objs, err = adapt(objs, "/x", "0.0.0.0:53"); err == nil {
			var buf bytes.Buffer
			_ = encode(&buf, objs)
		}
	})
}
