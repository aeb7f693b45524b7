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

func run(t *testing.T, in string, cgroupPath, dnsListen string, workers bool) []object {
	t.Helper()
	objs, err := decode(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	objs, err = adapt(objs, cgroupPath, dnsListen, workers)
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

func agentConfig(t *testing.T, cm object) map[string]any {
	t.Helper()
	if cm == nil {
		t.Fatal("ConfigMap missing")
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm["data"].(map[string]any)[configKey].(string)), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestWithoutFlagsOnlyTheConfigIsReencoded(t *testing.T) {
	objs := run(t, install, "", "", false)
	if len(objs) != 3 {
		t.Fatalf("%d objects, want the 3 given", len(objs))
	}
	cfg := agentConfig(t, find(objs, "ConfigMap", configMapName))
	if cfg["cgroupPath"] != "/host/sys/fs/cgroup" || cfg["gateway"] != true || cfg["dns"] != nil {
		t.Errorf("config changed without a flag: %v", cfg)
	}
}

func TestCgroupPathAndDNSListen(t *testing.T) {
	cfg := agentConfig(t, find(run(t, install, "/host/sys/fs/cgroup/unified", "0.0.0.0:5353", false), "ConfigMap", configMapName))
	if cfg["cgroupPath"] != "/host/sys/fs/cgroup/unified" {
		t.Errorf("cgroupPath %v", cfg["cgroupPath"])
	}
	if dns, _ := cfg["dns"].(map[string]any); dns["listen"] != "0.0.0.0:5353" {
		t.Errorf("dns %v", cfg["dns"])
	}
}

func TestWorkersGetADaemonSetAndConfigOfTheirOwn(t *testing.T) {
	objs := run(t, install, "", "", true)
	if len(objs) != 5 {
		t.Fatalf("%d objects, want the 3 given and 2 for the workers", len(objs))
	}
	gw := agentConfig(t, find(objs, "ConfigMap", configMapName))
	if gw["gateway"] != true {
		t.Errorf("the gateways' config lost gateway: true: %v", gw)
	}
	w := agentConfig(t, find(objs, "ConfigMap", workerConfigMap))
	if w["gateway"] != false || w["kubernetes"].(map[string]any)["enabled"] != false || w["cluster"] != "east" {
		t.Errorf("worker config %v: want gateway false, no Kubernetes exports, the same cluster", w)
	}
	ds := find(objs, "DaemonSet", workerName)
	if ds == nil {
		t.Fatal("no worker DaemonSet")
	}
	pod := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	if sel := pod["nodeSelector"].(map[string]any); sel[gatewayLabel] != "false" {
		t.Errorf("worker nodeSelector %v", sel)
	}
	match := ds["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any)
	if match["app.kubernetes.io/name"] != workerName {
		t.Errorf("worker selector %v: must not select the gateways' pods", match)
	}
	var cmVol, secretVol bool
	for _, v := range pod["volumes"].([]any) {
		vm := v.(map[string]any)
		if cm, ok := vm["configMap"].(map[string]any); ok {
			cmVol = cm["name"] == workerConfigMap
		}
		if s, ok := vm["secret"].(map[string]any); ok {
			secretVol = s["secretName"] == "cable-join-token"
		}
	}
	if !cmVol || !secretVol {
		t.Errorf("worker volumes %v: want the worker ConfigMap and the same join token Secret", pod["volumes"])
	}
	// The gateways' DaemonSet is untouched.
	gwPod := find(objs, "DaemonSet", daemonSetName)["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	if gwPod["nodeSelector"].(map[string]any)[gatewayLabel] != "true" {
		t.Errorf("the gateways' DaemonSet changed: %v", gwPod["nodeSelector"])
	}
}

func TestBadInputIsAnErrorNotAPanic(t *testing.T) {
	for _, in := range []string{
		"kind: ConfigMap\nmetadata: {name: cable-agent-config}\ndata: {agent.yaml: '[1, 2'}\n",
		"kind: DaemonSet\nmetadata: {name: cable-agent}\nspec: {}\n",
		"- a\n- b\n",
	} {
		objs, err := decode(strings.NewReader(in))
		if err == nil {
			_, err = adapt(objs, "", "", true)
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
		if objs, err = adapt(objs, "/x", "0.0.0.0:5353", true); err == nil {
			var buf bytes.Buffer
			_ = encode(&buf, objs)
		}
	})
}
