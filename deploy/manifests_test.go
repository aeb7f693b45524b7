// Package deploy holds the Kubernetes manifests (deploy/daemonset) and systemd units
// (deploy/systemd). This test decodes every manifest with the real Kubernetes API types, strictly,
// and checks what the agent needs from them; the agent config inside the ConfigMap is parsed by
// the agent's own config package, so the two cannot drift apart.
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	_ "github.com/cablemesh/cablemesh/cable/drivers" // the agent config names driver blocks

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/cablemesh/cablemesh/agent/config"
)

const namespace = "cablemesh"

func decoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatalf("scheme: %v", err)
		}
	}
	// Strict: unknown and duplicate fields are errors, as kubectl apply --validate=strict does.
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// decodeAll decodes every YAML document of every file in dir.
func decodeAll(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	dec := decoder(t)
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufioReader(data))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := dec.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: decode with the Kubernetes API types: %v", f, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

type manifests struct {
	namespaces      []*corev1.Namespace
	serviceAccounts []*corev1.ServiceAccount
	configMaps      []*corev1.ConfigMap
	daemonSets      []*appsv1.DaemonSet
}

func load(t *testing.T) manifests {
	t.Helper()
	var m manifests
	for _, o := range decodeAll(t, "daemonset") {
		switch o := o.(type) {
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, o)
		case *corev1.ServiceAccount:
			m.serviceAccounts = append(m.serviceAccounts, o)
		case *corev1.ConfigMap:
			m.configMaps = append(m.configMaps, o)
		case *appsv1.DaemonSet:
			m.daemonSets = append(m.daemonSets, o)
		default:
			t.Fatalf("unexpected object %T in deploy/daemonset", o)
		}
	}
	if len(m.namespaces) != 1 || len(m.serviceAccounts) != 1 || len(m.configMaps) != 1 || len(m.daemonSets) != 1 {
		t.Fatalf("want one Namespace, ServiceAccount, ConfigMap and DaemonSet; have %d, %d, %d, %d",
			len(m.namespaces), len(m.serviceAccounts), len(m.configMaps), len(m.daemonSets))
	}
	return m
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// mountFor returns the volume mounted at the directory holding file (or at file itself).
func mountFor(t *testing.T, ps corev1.PodSpec, c corev1.Container, file string) corev1.Volume {
	t.Helper()
	var best corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if (file == m.MountPath || strings.HasPrefix(file, m.MountPath+"/")) && len(m.MountPath) > len(best.MountPath) {
			best = m
		}
	}
	if best.Name == "" {
		t.Fatalf("container %s mounts nothing at %s", c.Name, file)
	}
	for _, v := range ps.Volumes {
		if v.Name == best.Name {
			return v
		}
	}
	t.Fatalf("container %s mounts volume %q, which the pod does not declare", c.Name, best.Name)
	return corev1.Volume{}
}

func TestManifestsDecodeStrictly(t *testing.T) {
	m := load(t)
	if m.namespaces[0].Name != namespace {
		t.Errorf("namespace %q, want %q", m.namespaces[0].Name, namespace)
	}
	for _, o := range []interface{ GetNamespace() string }{m.serviceAccounts[0], m.configMaps[0], m.daemonSets[0]} {
		if o.GetNamespace() != namespace {
			t.Errorf("%T is in namespace %q, want %q", o, o.GetNamespace(), namespace)
		}
	}
}

func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  hostNetworking: true\n")
	if _, _, err := decoder(t).Decode(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "hostNetworking") {
		t.Fatalf("a misspelt field decoded without an error naming it: %v", err)
	}
}

func TestDaemonSet(t *testing.T) {
	m := load(t)
	ds := m.daemonSets[0]
	ps := ds.Spec.Template.Spec
	agent := container(t, ps.Containers, "cable-agent")

	checks := []struct {
		name string
		ok   bool
		got  any
	}{
		{"the agent runs in the host's network namespace", ps.HostNetwork, ps.HostNetwork},
		{"DNS still resolves cluster names with host networking", ps.DNSPolicy == corev1.DNSClusterFirstWithHostNet, ps.DNSPolicy},
		{"only gateway nodes run it", ps.NodeSelector["cablemesh.io/gateway"] == "true", ps.NodeSelector},
		{"the selector matches the pod template", ds.Spec.Selector != nil && labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels), ds.Spec.Selector},
		{"it uses the manifests' service account", ps.ServiceAccountName == m.serviceAccounts[0].Name, ps.ServiceAccountName},
		{"no Kubernetes API token is mounted", ps.AutomountServiceAccountToken != nil && !*ps.AutomountServiceAccountToken, ps.AutomountServiceAccountToken},
		{"the agent may manage links and routes (NET_ADMIN)", hasCap(agent, "NET_ADMIN"), agent.SecurityContext},
		{"the agent may send probes (NET_RAW)", hasCap(agent, "NET_RAW"), agent.SecurityContext},
		{"the agent is given its config file", len(agent.Args) == 2 && agent.Args[0] == "--config", agent.Args},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if !c.ok {
				t.Errorf("not so: %+v", c.got)
			}
		})
	}
	for _, cs := range [][]corev1.Container{ps.InitContainers, ps.Containers} {
		for _, c := range cs {
			for _, vm := range c.VolumeMounts {
				if !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name }) {
					t.Errorf("container %s mounts undeclared volume %q", c.Name, vm.Name)
				}
			}
		}
	}

	t.Run("the config file is rendered from the ConfigMap by the init container", func(t *testing.T) {
		cfgPath := agent.Args[len(agent.Args)-1]
		vol := mountFor(t, ps, agent, cfgPath)
		render := container(t, ps.InitContainers, "render-config")
		if v := mountFor(t, ps, render, cfgPath); v.Name != vol.Name {
			t.Errorf("render-config writes %s into volume %q, the agent reads it from %q", cfgPath, v.Name, vol.Name)
		}
		script := strings.Join(render.Command, " ")
		if !strings.Contains(script, "> "+cfgPath) {
			t.Errorf("render-config does not write %s: %q", cfgPath, script)
		}
		var tmpl corev1.Volume
		for _, vm := range render.VolumeMounts {
			if src := vm.MountPath + "/agent.yaml"; src != cfgPath && strings.Contains(script, src) {
				tmpl = mountFor(t, ps, render, vm.MountPath+"/agent.yaml")
			}
		}
		if tmpl.ConfigMap == nil || tmpl.ConfigMap.Name != m.configMaps[0].Name {
			t.Fatalf("render-config does not read agent.yaml from ConfigMap %s: %+v", m.configMaps[0].Name, tmpl)
		}
		for _, env := range []string{"NODE_NAME", "NODE_IP"} {
			if !slices.ContainsFunc(render.Env, func(e corev1.EnvVar) bool { return e.Name == env && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil }) {
				t.Errorf("render-config lacks %s from the downward API", env)
			}
		}
	})

	t.Run("the ConfigMap holds a valid agent config whose paths are mounted", func(t *testing.T) {
		raw, ok := m.configMaps[0].Data["agent.yaml"]
		if !ok {
			t.Fatalf("ConfigMap %s has no agent.yaml", m.configMaps[0].Name)
		}
		rendered := strings.NewReplacer("${NODE_NAME}", "node-1", "${NODE_IP}", "192.0.2.10").Replace(raw)
		cfg, err := config.Parse([]byte(rendered))
		if err != nil {
			t.Fatalf("the agent refuses the ConfigMap's config: %v", err)
		}
		if !cfg.Gateway {
			t.Errorf("gateway = false in a DaemonSet that runs on gateway nodes")
		}
		if v := mountFor(t, ps, agent, cfg.JoinTokenFile); v.Secret == nil {
			t.Errorf("joinTokenFile %s is not on a Secret volume: %+v", cfg.JoinTokenFile, v)
		} else if key := path.Base(cfg.JoinTokenFile); key != "join-token" {
			t.Errorf("joinTokenFile names key %q, the README's secret command creates join-token", key)
		}
		if v := mountFor(t, ps, agent, cfg.StateDir); v.HostPath == nil || v.HostPath.Path != "/var/lib/cablemesh" {
			t.Errorf("stateDir %s is not the host's /var/lib/cablemesh (keys and cache must survive the pod): %+v", cfg.StateDir, v)
		}
		if v := mountFor(t, ps, agent, cfg.StatusSocket); v.HostPath == nil || v.HostPath.Path != "/run/cablemesh" {
			t.Errorf("statusSocket %s is not under the host's /run/cablemesh (cablectl status runs on the host): %+v", cfg.StatusSocket, v)
		}
	})

	t.Run("the TUN device is available for userspace WireGuard", func(t *testing.T) {
		v := mountFor(t, ps, agent, "/dev/net/tun")
		if v.HostPath == nil || v.HostPath.Path != "/dev/net/tun" || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathCharDev {
			t.Errorf("/dev/net/tun is not the host's character device: %+v", v)
		}
	})
}

func hasCap(c corev1.Container, name corev1.Capability) bool {
	sc := c.SecurityContext
	if sc == nil {
		return false
	}
	if sc.Privileged != nil && *sc.Privileged {
		return true
	}
	return sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, name)
}

func labelsMatch(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
