// The manifests tests decode every object of deploy/ (as kustomize reads the files) and of the
// rendered `cablectl install kubernetes` output with the real Kubernetes API types, strictly, and
// check what matters: no secret in an environment variable, probes and resources on every
// long-running container, no privileged container, the agent's capabilities exactly those listed,
// minimal RBAC; the agent config inside the ConfigMap is parsed by the agent's own config
// package, so the two cannot drift apart.
package deploy

import (
	"encoding/base64"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	_ "github.com/cablemesh/cablemesh/cable/drivers" // the agent config names driver blocks

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/agent/config"
)

const namespace = "cablemesh"

func decoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatalf("scheme: %v", err)
		}
	}
	// Strict: unknown and duplicate fields are errors, as kubectl apply --validate=strict does.
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// decodeStream decodes every document of a YAML stream with the API types.
func decodeStream(t *testing.T, what string, data []byte) []runtime.Object {
	t.Helper()
	docs, err := DecodeDocs(data)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	dec := decoder(t)
	var out []runtime.Object
	for _, d := range docs {
		raw, err := yaml.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := dec.Decode(raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: %s: decode with the Kubernetes API types: %v", what, kindName(d), err)
		}
		out = append(out, obj)
	}
	return out
}

// kustomization is the part of kustomization.yaml these tests read.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

// decodeDir decodes the objects of a kustomize directory, following its resources as kustomize
// does (a directory entry is another kustomization), and checks that every YAML file of the
// directory is listed, so nothing in the directory is silently left out of `kubectl apply -k`.
func decodeDir(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(k.Resources, b) {
			t.Errorf("%s/kustomization.yaml does not list %s", dir, b)
		}
	}
	var out []runtime.Object
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, decodeDir(t, p)...)
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s/kustomization.yaml lists %s: %v", dir, r, err)
		}
		out = append(out, decodeStream(t, p, data)...)
	}
	return out
}

type manifests struct {
	namespaces      []*corev1.Namespace
	serviceAccounts []*corev1.ServiceAccount
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	daemonSets      []*appsv1.DaemonSet
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	pvcs            []*corev1.PersistentVolumeClaim
	clusterRoles    []*rbacv1.ClusterRole
	bindings        []*rbacv1.ClusterRoleBinding
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
	crds            []*apiextensionsv1.CustomResourceDefinition
}

func sortObjects(t *testing.T, objs []runtime.Object) manifests {
	t.Helper()
	var m manifests
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, o)
		case *corev1.ServiceAccount:
			m.serviceAccounts = append(m.serviceAccounts, o)
		case *corev1.ConfigMap:
			m.configMaps = append(m.configMaps, o)
		case *corev1.Secret:
			m.secrets = append(m.secrets, o)
		case *appsv1.DaemonSet:
			m.daemonSets = append(m.daemonSets, o)
		case *appsv1.Deployment:
			m.deployments = append(m.deployments, o)
		case *corev1.Service:
			m.services = append(m.services, o)
		case *corev1.PersistentVolumeClaim:
			m.pvcs = append(m.pvcs, o)
		case *rbacv1.ClusterRole:
			m.clusterRoles = append(m.clusterRoles, o)
		case *rbacv1.ClusterRoleBinding:
			m.bindings = append(m.bindings, o)
		case *rbacv1.Role:
			m.roles = append(m.roles, o)
		case *rbacv1.RoleBinding:
			m.roleBindings = append(m.roleBindings, o)
		case *apiextensionsv1.CustomResourceDefinition:
			m.crds = append(m.crds, o)
		default:
			t.Fatalf("unexpected object %T", o)
		}
	}
	return m
}

// memberCluster is deploy/daemonset as kustomize builds it.
func memberCluster(t *testing.T) manifests {
	t.Helper()
	m := sortObjects(t, decodeDir(t, "daemonset"))
	if len(m.namespaces) != 1 || len(m.serviceAccounts) != 1 || len(m.configMaps) != 1 || len(m.daemonSets) != 2 ||
		len(m.clusterRoles) != 3 || len(m.bindings) != 3 || len(m.roles) != 2 || len(m.roleBindings) != 2 || len(m.crds) != 4 {
		t.Fatalf("want one Namespace, ServiceAccount, ConfigMap, two DaemonSets, three ClusterRoles and ClusterRoleBindings (the agent's, the service-imports writer's, the status writer's), two Roles and RoleBindings and 4 CRDs; have %d, %d, %d, %d, %d, %d, %d, %d, %d",
			len(m.namespaces), len(m.serviceAccounts), len(m.configMaps), len(m.daemonSets), len(m.clusterRoles), len(m.bindings), len(m.roles), len(m.roleBindings), len(m.crds))
	}
	return m
}

var installValues = AgentValues{
	Cluster:      "west",
	Broker:       "broker.mesh.example:7443",
	PodCIDRs:     []string{"10.2.0.0/16"},
	ServiceCIDRs: []string{"10.102.0.0/16"},
	JoinToken:    "cm1.eyJjbHVzdGVyIjoid2VzdCJ9.c2lnbmF0dXJl",
}

// installed is the `cablectl install kubernetes` output for values.
func installed(t *testing.T, v AgentValues) manifests {
	t.Helper()
	out, err := AgentManifests(v)
	if err != nil {
		t.Fatal(err)
	}
	m := sortObjects(t, decodeStream(t, "install output", out))
	if len(m.daemonSets) != 2 || m.daemonSets[0].Name != DaemonSetName || m.daemonSets[1].Name != WorkerDaemonSetName ||
		len(m.configMaps) == 0 || m.configMaps[0].Name != ConfigMapName || len(m.clusterRoles) != 3 || len(m.roles) != 2 {
		t.Fatalf("install output lacks the DaemonSets, ConfigMap, ClusterRole or Role: %q", SortedKinds(mustDocs(t, out)))
	}
	return m
}

func mustDocs(t *testing.T, data []byte) []Object {
	t.Helper()
	d, err := DecodeDocs(data)
	if err != nil {
		t.Fatal(err)
	}
	return d
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

// checkPodSpec holds for every pod the manifests run.
func checkPodSpec(t *testing.T, owner string, ps corev1.PodSpec) {
	t.Helper()
	all := append(slices.Clone(ps.InitContainers), ps.Containers...)
	for _, c := range all {
		sc := c.SecurityContext
		if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			if sc == nil || sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: container %s is privileged or has no security context", owner, c.Name)
			}
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: container %s allows privilege escalation", owner, c.Name)
		}
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: container %s does not drop every capability before adding its own", owner, c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: container %s lacks cpu/memory requests or a memory limit: %+v", owner, c.Name, c.Resources)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("%s: container %s takes secret %s into environment variable %s; mount it as a file", owner, c.Name, e.ValueFrom.SecretKeyRef.Name, e.Name)
			}
			if strings.Contains(e.Value, installValues.JoinToken) || strings.Contains(strings.ToUpper(e.Name), "TOKEN") || strings.Contains(strings.ToUpper(e.Name), "PSK") {
				t.Errorf("%s: container %s has a secret-looking environment variable %s", owner, c.Name, e.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				t.Errorf("%s: container %s takes secret %s into its environment; mount it as a file", owner, c.Name, ef.SecretRef.Name)
			}
		}
		for _, vm := range c.VolumeMounts {
			if !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name }) {
				t.Errorf("%s: container %s mounts undeclared volume %q", owner, c.Name, vm.Name)
			}
		}
	}
	for _, c := range ps.Containers {
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("%s: container %s lacks a readiness or liveness probe", owner, c.Name)
		}
	}
}

func TestMemberClusterManifests(t *testing.T) {
	for name, m := range map[string]manifests{
		"deploy/daemonset (kustomize)": memberCluster(t),
		"cablectl install kubernetes":  installed(t, installValues),
	} {
		t.Run(name, func(t *testing.T) {
			for _, o := range []interface{ GetNamespace() string }{m.serviceAccounts[0], m.configMaps[0], m.daemonSets[0]} {
				if o.GetNamespace() != namespace {
					t.Errorf("%T is in namespace %q, want %q", o, o.GetNamespace(), namespace)
				}
			}
			checkAgentDaemonSet(t, m)
			checkAgentRBAC(t, m)
			checkServiceImportsRBAC(t, m)
			checkKubeStatusRBAC(t, m)
		})
	}
}

func checkAgentDaemonSet(t *testing.T, m manifests) {
	ds := m.daemonSets[0]
	ps := ds.Spec.Template.Spec
	checkPodSpec(t, "DaemonSet "+ds.Name, ps)
	agent := container(t, ps.Containers, AgentContainer)

	caps := agent.SecurityContext.Capabilities.Add
	slices.Sort(caps)
	if want := []corev1.Capability{"BPF", "NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW", "PERFMON", "SYS_ADMIN"}; !slices.Equal(caps, want) {
		t.Errorf("agent capabilities %q, want exactly %q", caps, want)
	}
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
		{"the agent is given its config file", len(agent.Args) == 2 && agent.Args[0] == "--config", agent.Args},
		{"readiness is the agent's /readyz", agent.ReadinessProbe != nil && agent.ReadinessProbe.HTTPGet != nil && agent.ReadinessProbe.HTTPGet.Path == "/readyz", agent.ReadinessProbe},
		{"liveness is the agent's /healthz", agent.LivenessProbe != nil && agent.LivenessProbe.HTTPGet != nil && agent.LivenessProbe.HTTPGet.Path == "/healthz", agent.LivenessProbe},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if !c.ok {
				t.Errorf("not so: %+v", c.got)
			}
		})
	}

	t.Run("the agent reads its config straight from the ConfigMap, so edits reach it live", func(t *testing.T) {
		cfgPath := agent.Args[len(agent.Args)-1]
		vol := mountFor(t, ps, agent, cfgPath)
		if vol.ConfigMap == nil || vol.ConfigMap.Name != m.configMaps[0].Name {
			t.Fatalf("%s is not on ConfigMap %s: %+v", cfgPath, m.configMaps[0].Name, vol)
		}
		// The kubelet updates a ConfigMap volume in place only when it is not mounted by subPath.
		for _, vm := range agent.VolumeMounts {
			if vm.Name == vol.Name && vm.SubPath != "" {
				t.Errorf("the config is mounted with subPath %q: the kubelet never updates it", vm.SubPath)
			}
		}
		if len(ps.InitContainers) > 0 && slices.ContainsFunc(ps.InitContainers, func(c corev1.Container) bool {
			return slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == vol.Name })
		}) {
			t.Errorf("an init container writes the config volume: a copy would not follow the ConfigMap")
		}
		if !slices.ContainsFunc(agent.Env, func(e corev1.EnvVar) bool {
			return e.Name == config.NodeNameEnv && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
		}) {
			t.Errorf("the agent lacks %s from the downward API (spec.nodeName): it names the node and finds its Node object by it", config.NodeNameEnv)
		}
	})

	t.Run("the ConfigMap holds a valid agent config whose paths are mounted", func(t *testing.T) {
		cfg := agentConfig(t, m.configMaps[0])
		if !cfg.Gateway {
			t.Errorf("gateway = false in a DaemonSet that runs on gateway nodes")
		}
		if !cfg.Kubernetes.Enabled {
			t.Errorf("kubernetes.enabled = false: the agent would not read ServiceExports and policies from the API")
		}
		if v := mountFor(t, ps, agent, cfg.JoinTokenFile); v.Secret == nil {
			t.Errorf("joinTokenFile %s is not on a Secret volume: %+v", cfg.JoinTokenFile, v)
		} else if key := path.Base(cfg.JoinTokenFile); key != SecretKey || v.Secret.SecretName != SecretName {
			t.Errorf("joinTokenFile names key %q of Secret %q; install writes key %q of %q", key, v.Secret.SecretName, SecretKey, SecretName)
		}
		if v := mountFor(t, ps, agent, cfg.StateDir); v.HostPath == nil || v.HostPath.Path != "/var/lib/cablemesh" {
			t.Errorf("stateDir %s is not the host's /var/lib/cablemesh (keys and cache must survive the pod): %+v", cfg.StateDir, v)
		}
		if v := mountFor(t, ps, agent, cfg.StatusSocket); v.HostPath == nil || v.HostPath.Path != "/run/cablemesh" {
			t.Errorf("statusSocket %s is not under the host's /run/cablemesh (cablectl status runs on the host): %+v", cfg.StatusSocket, v)
		}
		if v := mountFor(t, ps, agent, cfg.BPFPinDir); v.HostPath == nil || v.HostPath.Path != "/sys/fs/bpf" {
			t.Errorf("bpfPinDir %s is not on the host's bpffs (pins must outlive the pod): %+v", cfg.BPFPinDir, v)
		}
		if v := mountFor(t, ps, agent, cfg.CgroupPath); v.HostPath == nil || v.HostPath.Path != "/sys/fs/cgroup" {
			t.Errorf("cgroupPath %s is not the host's cgroup2 root (the socket LB must see every pod): %+v", cfg.CgroupPath, v)
		}
		_, port, _ := strings.Cut(cfg.MetricsAddress, ":")
		for name, probe := range map[string]*corev1.Probe{"readiness": agent.ReadinessProbe, "liveness": agent.LivenessProbe} {
			if got := probe.HTTPGet.Port; got.String() != port {
				t.Errorf("the %s probe's port %v is not the metricsAddress %s the agent serves /readyz and /healthz on", name, got.String(), cfg.MetricsAddress)
			}
		}
		if len(agent.Ports) > 0 {
			// In the host's network each containerPort is a hostPort: a roll's new pod would
			// not fit beside the old one.
			t.Errorf("the agent container declares ports %+v: they are hostPorts and keep a surge pod off its node", agent.Ports)
		}
	})

	t.Run("the TUN device is available for userspace WireGuard", func(t *testing.T) {
		v := mountFor(t, ps, agent, "/dev/net/tun")
		if v.HostPath == nil || v.HostPath.Path != "/dev/net/tun" || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathCharDev {
			t.Errorf("/dev/net/tun is not the host's character device: %+v", v)
		}
	})
}

// agentConfig parses the ConfigMap's agent.yaml as the agent reads it on a node (NODE_NAME set by
// the DaemonSet). Nothing in it may be per node: the same file serves every gateway.
func agentConfig(t *testing.T, cm *corev1.ConfigMap) *config.Config {
	t.Helper()
	raw, ok := cm.Data[ConfigMapKey]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", cm.Name, ConfigMapKey)
	}
	if strings.Contains(raw, "${") {
		t.Errorf("ConfigMap %s holds a placeholder nothing fills in any more:\n%s", cm.Name, raw)
	}
	t.Setenv(config.NodeNameEnv, "node-1")
	cfg, err := config.Parse([]byte(raw))
	if err != nil {
		t.Fatalf("the agent refuses the ConfigMap's config: %v\n%s", err, raw)
	}
	if cfg.Node != "node-1" {
		t.Errorf("node %q: want the Node's name from $%s", cfg.Node, config.NodeNameEnv)
	}
	return cfg
}

// grant is one (API group, resource, verb) an RBAC rule allows, with the names it is limited to.
type grant struct{ group, resource, verb, names string }

// grants flattens rules, refusing wildcards and non-resource URLs.
func grants(t *testing.T, rules []rbacv1.PolicyRule) []grant {
	t.Helper()
	var got []grant
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("unexpected rule shape %+v", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if g == "*" || res == "*" || v == "*" || slices.Contains(r.ResourceNames, "*") {
						t.Errorf("wildcard in rule %+v", r)
					}
					got = append(got, grant{g, res, v, strings.Join(r.ResourceNames, ",")})
				}
			}
		}
	}
	cmp := func(a, b grant) int {
		return strings.Compare(a.group+"/"+a.resource+"/"+a.verb+"/"+a.names, b.group+"/"+b.resource+"/"+b.verb+"/"+b.names)
	}
	slices.SortFunc(got, cmp)
	return got
}

// checkAgentRBAC: exactly the reads the informers need, one write (ServiceExport status), and
// the reads of the agents' own namespace and DaemonSets by name (uninstall or restart).
func checkAgentRBAC(t *testing.T, m manifests) {
	role, binding := m.clusterRoles[0], m.bindings[0]
	got := grants(t, role.Rules)
	var exp []grant
	for _, r := range []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes", "services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"serviceexports", "serviceimports"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"cablemesh.io"}, Resources: []string{"clusterconnectionpolicies"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{Namespace}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"serviceexports/status"}, Verbs: []string{"update"}},
	} {
		exp = append(exp, grants(t, []rbacv1.PolicyRule{r})...)
	}
	exp = grants(t, ruleOf(exp))
	if !slices.Equal(got, exp) {
		t.Errorf("ClusterRole grants\n%v\nwant exactly\n%v", got, exp)
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != m.serviceAccounts[0].Name || binding.Subjects[0].Namespace != namespace {
		t.Errorf("ClusterRoleBinding does not bind %s to the agent's service account: %+v", role.Name, binding)
	}
	nsRole, nsBinding := m.roles[0], m.roleBindings[0]
	wantNS := []grant{}
	for _, v := range []string{"get", "list", "watch"} {
		wantNS = append(wantNS, grant{"apps", "daemonsets", v, DaemonSetName + "," + WorkerDaemonSetName})
	}
	if got := grants(t, nsRole.Rules); nsRole.Namespace != namespace || !slices.Equal(got, wantNS) {
		t.Errorf("Role %s/%s grants\n%v\nwant exactly\n%v", nsRole.Namespace, nsRole.Name, got, wantNS)
	}
	if nsBinding.Namespace != namespace || nsBinding.RoleRef.Kind != "Role" || nsBinding.RoleRef.Name != nsRole.Name || len(nsBinding.Subjects) != 1 ||
		nsBinding.Subjects[0].Name != m.serviceAccounts[0].Name || nsBinding.Subjects[0].Namespace != namespace {
		t.Errorf("RoleBinding does not bind %s to the agent's service account: %+v", nsRole.Name, nsBinding)
	}
}

// checkServiceImportsRBAC: the service-imports writer writes ServiceImports (and their status)
// and EndpointSlices and holds its Lease in the agents' namespace.
func checkServiceImportsRBAC(t *testing.T, m manifests) {
	role, binding := m.clusterRoles[1], m.bindings[1]
	var exp []grant
	for _, r := range []rbacv1.PolicyRule{
		{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"serviceimports"}, Verbs: []string{"list", "create", "update", "delete"}},
		{APIGroups: []string{"multicluster.x-k8s.io"}, Resources: []string{"serviceimports/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "create", "update", "delete"}},
	} {
		exp = append(exp, grants(t, []rbacv1.PolicyRule{r})...)
	}
	exp = grants(t, ruleOf(exp))
	if got := grants(t, role.Rules); role.Name != "cablemesh-service-imports" || !slices.Equal(got, exp) {
		t.Errorf("ClusterRole %s grants\n%v\nwant exactly\n%v", role.Name, got, exp)
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != m.serviceAccounts[0].Name || binding.Subjects[0].Namespace != namespace {
		t.Errorf("ClusterRoleBinding does not bind %s to the agent's service account: %+v", role.Name, binding)
	}
	nsRole, nsBinding := m.roles[1], m.roleBindings[1]
	wantNS := grants(t, []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"cablemesh-service-imports"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	})
	if got := grants(t, nsRole.Rules); nsRole.Namespace != namespace || !slices.Equal(got, wantNS) {
		t.Errorf("Role %s/%s grants\n%v\nwant exactly\n%v", nsRole.Namespace, nsRole.Name, got, wantNS)
	}
	if nsBinding.Namespace != namespace || nsBinding.RoleRef.Name != nsRole.Name || len(nsBinding.Subjects) != 1 || nsBinding.Subjects[0].Name != m.serviceAccounts[0].Name {
		t.Errorf("RoleBinding does not bind %s to the agent's service account: %+v", nsRole.Name, nsBinding)
	}
}

// checkKubeStatusRBAC: the status writer keeps the ClusterLinks and writes the policies' status,
// nothing else.
func checkKubeStatusRBAC(t *testing.T, m manifests) {
	role, binding := m.clusterRoles[2], m.bindings[2]
	exp := grants(t, []rbacv1.PolicyRule{
		{APIGroups: []string{"cablemesh.io"}, Resources: []string{"clusterlinks"}, Verbs: []string{"list", "create", "update", "delete"}},
		{APIGroups: []string{"cablemesh.io"}, Resources: []string{"clusterconnectionpolicies/status"}, Verbs: []string{"update"}},
	})
	if got := grants(t, role.Rules); role.Name != "cablemesh-kube-status" || !slices.Equal(got, exp) {
		t.Errorf("ClusterRole %s grants\n%v\nwant exactly\n%v", role.Name, got, exp)
	}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Name != m.serviceAccounts[0].Name || binding.Subjects[0].Namespace != namespace {
		t.Errorf("ClusterRoleBinding does not bind %s to the agent's service account: %+v", role.Name, binding)
	}
}

// ruleOf turns grants back into one rule each (for sorting through grants).
func ruleOf(gs []grant) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, g := range gs {
		r := rbacv1.PolicyRule{APIGroups: []string{g.group}, Resources: []string{g.resource}, Verbs: []string{g.verb}}
		if g.names != "" {
			r.ResourceNames = strings.Split(g.names, ",")
		}
		out = append(out, r)
	}
	return out
}

func TestInstallOutputCarriesTheClustersValues(t *testing.T) {
	m := installed(t, installValues)
	cfg := agentConfig(t, m.configMaps[0])
	if cfg.Cluster != "west" || cfg.Broker != installValues.Broker || !slices.Equal(cfg.PodCIDRs, installValues.PodCIDRs) || !slices.Equal(cfg.ServiceCIDRs, installValues.ServiceCIDRs) {
		t.Errorf("agent config cluster %q broker %q pods %q services %q, want the install's values", cfg.Cluster, cfg.Broker, cfg.PodCIDRs, cfg.ServiceCIDRs)
	}
	if len(m.secrets) != 1 || m.secrets[0].Name != SecretName || m.secrets[0].Namespace != namespace {
		t.Fatalf("want the join token Secret %s/%s, have %+v", namespace, SecretName, m.secrets)
	}
	if got := string(m.secrets[0].Data[SecretKey]); got != installValues.JoinToken {
		t.Errorf("Secret holds %q under %s, want the join token", got, SecretKey)
	}
	for _, o := range []interface{ GetLabels() map[string]string }{m.namespaces[0], m.configMaps[0], m.secrets[0], m.daemonSets[0], m.clusterRoles[0]} {
		if o.GetLabels()[ClusterLabel] != "west" {
			t.Errorf("%T lacks label %s=west (kubectl delete -l finds the cluster's objects by it)", o, ClusterLabel)
		}
	}
	if raw, _ := Encode(nil); len(raw) != 0 {
		t.Errorf("encoding nothing printed %q", raw)
	}
	// The token is in the Secret only: nowhere else in the output, base64 or not.
	out, _ := AgentManifests(installValues)
	if n := strings.Count(string(out), base64.StdEncoding.EncodeToString([]byte(installValues.JoinToken))); n != 1 || strings.Contains(string(out), installValues.JoinToken) {
		t.Errorf("the token appears %d times encoded (want 1) or in clear text in the output", n)
	}
}

func TestInstallGatewayNodes(t *testing.T) {
	tests := []struct {
		name      string
		selector  string
		wantSel   map[string]string
		wantExprs []corev1.NodeSelectorRequirement
	}{
		{"the default is the cablemesh.io/gateway label", "", map[string]string{"kubernetes.io/os": "linux", "cablemesh.io/gateway": "true"}, nil},
		{"equality requirements become the nodeSelector", "role=edge,zone=a", map[string]string{"kubernetes.io/os": "linux", "role": "edge", "zone": "a"}, nil},
		{"set-based requirements become a required node affinity", "role=edge,zone in (a,b),!spot", map[string]string{"kubernetes.io/os": "linux", "role": "edge"},
			[]corev1.NodeSelectorRequirement{{Key: "spot", Operator: corev1.NodeSelectorOpDoesNotExist}, {Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := installValues
			v.GatewayNodes = tt.selector
			ps := installed(t, v).daemonSets[0].Spec.Template.Spec
			if len(ps.NodeSelector) != len(tt.wantSel) {
				t.Errorf("nodeSelector %v, want %v", ps.NodeSelector, tt.wantSel)
			}
			for k, want := range tt.wantSel {
				if ps.NodeSelector[k] != want {
					t.Errorf("nodeSelector %v, want %v", ps.NodeSelector, tt.wantSel)
				}
			}
			var got []corev1.NodeSelectorRequirement
			if a := ps.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
					got = append(got, term.MatchExpressions...)
				}
			}
			slices.SortFunc(got, func(a, b corev1.NodeSelectorRequirement) int { return strings.Compare(a.Key, b.Key) })
			if len(got) != len(tt.wantExprs) {
				t.Fatalf("node affinity %+v, want %+v", got, tt.wantExprs)
			}
			for i := range got {
				if got[i].Key != tt.wantExprs[i].Key || got[i].Operator != tt.wantExprs[i].Operator || !slices.Equal(got[i].Values, tt.wantExprs[i].Values) {
					t.Errorf("node affinity %+v, want %+v", got, tt.wantExprs)
				}
			}
		})
	}
}

func TestInstallRefusesBadValues(t *testing.T) {
	tests := []struct {
		name   string
		change func(*AgentValues)
		want   string
	}{
		{"a cluster name that is no DNS label", func(v *AgentValues) { v.Cluster = "West_1" }, `cluster "West_1"`},
		{"a broker address without a port", func(v *AgentValues) { v.Broker = "broker.example" }, `broker address "broker.example"`},
		{"a broker address that would inject YAML", func(v *AgentValues) { v.Broker = "a:1\nlogLevel: debug" }, "broker address"},
		{"no pod CIDR", func(v *AgentValues) { v.PodCIDRs = nil }, "pod CIDRs"},
		{"a pod CIDR that is not one", func(v *AgentValues) { v.PodCIDRs = []string{"10.1.0.0/33"} }, "10.1.0.0/33"},
		{"a gateway selector that does not parse", func(v *AgentValues) { v.GatewayNodes = "zone in (a" }, `gateway nodes selector "zone in (a"`},
		{"a gateway selector that selects every node", func(v *AgentValues) { v.GatewayNodes = " " }, "selects every node"},
		{"an image with a blank", func(v *AgentValues) { v.Image = "cablemesh/agent latest" }, `image "cablemesh/agent latest"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := installValues
			tt.change(&v)
			_, err := AgentManifests(v)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestInstallIngressEnvoy(t *testing.T) {
	v := installValues
	v.IngressEnvoy = true
	m := installed(t, v)
	ps := m.daemonSets[0].Spec.Template.Spec
	agent := container(t, ps.Containers, AgentContainer)
	envoy := container(t, ps.Containers, EnvoyContainer)
	var cm, boot *corev1.ConfigMap
	for _, c := range m.configMaps {
		switch c.Name {
		case ConfigMapName:
			cm = c
		case EnvoyConfigMap:
			boot = c
		}
	}
	if cm == nil || boot == nil {
		t.Fatalf("want the agent config and Envoy's bootstrap ConfigMaps, have %d ConfigMaps", len(m.configMaps))
	}
	cfg := agentConfig(t, cm)
	if cfg.Ingress.Mode != "envoy" || cfg.Ingress.XDS.Listen != EnvoyXDSSocket {
		t.Errorf("agent config ingress %+v, want mode envoy serving xDS on %s", cfg.Ingress, EnvoyXDSSocket)
	}
	// Envoy reaches the agent's xDS socket through the same host directory.
	if a, e := mountFor(t, ps, agent, EnvoyXDSSocket), mountFor(t, ps, envoy, EnvoyXDSSocket); a.Name != e.Name {
		t.Errorf("the agent serves xDS in volume %q, Envoy looks in %q", a.Name, e.Name)
	}
	if v := mountFor(t, ps, envoy, "/etc/envoy/envoy.yaml"); v.ConfigMap == nil || v.ConfigMap.Name != EnvoyConfigMap {
		t.Errorf("Envoy's bootstrap is not the %s ConfigMap: %+v", EnvoyConfigMap, v)
	}
	if !strings.Contains(boot.Data["envoy.yaml"], EnvoyXDSSocket) {
		t.Errorf("the bootstrap does not point Envoy at %s:\n%s", EnvoyXDSSocket, boot.Data["envoy.yaml"])
	}
	if !slices.Contains(envoy.Command, "$(NODE_NAME)-ingress") || !slices.ContainsFunc(envoy.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" && e.ValueFrom != nil }) {
		t.Errorf("Envoy's node id is not the node's: command %q", envoy.Command)
	}
	if c := envoy.SecurityContext.Capabilities; c == nil || len(c.Add) != 0 {
		t.Errorf("Envoy adds capabilities: %+v", c)
	}
	if len(installed(t, installValues).daemonSets[0].Spec.Template.Spec.Containers) != 1 {
		t.Errorf("without --ingress-envoy the DaemonSet runs more than the agent")
	}
	out, err := AgentManifests(v)
	if err != nil {
		t.Fatal(err)
	}
	kubectlApplyDryRun(t, out)
}

func TestBrokerManifests(t *testing.T) {
	m := sortObjects(t, decodeDir(t, "broker"))
	if len(m.deployments) != 1 || len(m.pvcs) != 1 || len(m.services) < 1 || len(m.namespaces) != 1 {
		t.Fatalf("want a Namespace, a Deployment, a PVC and a Service; have %d, %d, %d, %d", len(m.namespaces), len(m.deployments), len(m.pvcs), len(m.services))
	}
	d := m.deployments[0]
	ps := d.Spec.Template.Spec
	checkPodSpec(t, "Deployment "+d.Name, ps)
	if got := m.namespaces[0].Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" || d.Namespace != m.namespaces[0].Name {
		t.Errorf("the broker's namespace enforces Pod Security %q, want restricted (it runs as non-root with nothing added)", got)
	}
	if sc := ps.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the broker pod has no RuntimeDefault seccomp profile, which restricted requires")
	}
	broker := container(t, ps.Containers, "cable-broker")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("the bbolt store takes one replica, replaced not rolled: replicas %v strategy %s", d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	if c := broker.SecurityContext.Capabilities; c == nil || len(c.Add) != 0 {
		t.Errorf("the broker adds capabilities: %+v", c)
	}
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		t.Errorf("the broker runs as root")
	}
	dataDir := ""
	for _, a := range broker.Args {
		if v, ok := strings.CutPrefix(a, "--data-dir="); ok {
			dataDir = v
		}
	}
	if v := mountFor(t, ps, broker, dataDir+"/broker.db"); v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != m.pvcs[0].Name {
		t.Errorf("--data-dir %q is not on the PVC %s: %+v", dataDir, m.pvcs[0].Name, v)
	}
	if !slices.ContainsFunc(broker.Args, func(a string) bool { return strings.HasPrefix(a, "--metrics-listen=") }) {
		t.Errorf("the broker serves no /readyz for its probes: no --metrics-listen in %q", broker.Args)
	}
	seed := container(t, ps.InitContainers, "seed-pki")
	if v := mountFor(t, ps, seed, "/etc/cablemesh/pki/ca.crt"); v.Secret == nil || v.Secret.Optional == nil || !*v.Secret.Optional {
		t.Errorf("the broker's certificates do not come from an optional Secret: %+v", v)
	}
	found := false
	for _, s := range m.services {
		for _, p := range s.Spec.Ports {
			if p.TargetPort.StrVal == "grpc" && labelsMatch(s.Spec.Selector, d.Spec.Template.Labels) {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("no Service exposes the broker's grpc port")
	}
}

func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  hostNetworking: true\n")
	if _, _, err := decoder(t).Decode(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "hostNetworking") {
		t.Fatalf("a misspelt field decoded without an error naming it: %v", err)
	}
}

// TestEmbeddedFilesAreTheFiles: cablectl renders from the binary, kustomize from disk; both must
// see the same objects.
func TestEmbeddedFilesAreTheFiles(t *testing.T) {
	for _, dir := range []string{"crds", "daemonset", "broker"} {
		emb, err := Docs(dir)
		if err != nil {
			t.Fatal(err)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		var disk []Object
		for _, f := range files {
			if filepath.Base(f) == "kustomization.yaml" {
				continue
			}
			data, _ := os.ReadFile(f)
			disk = append(disk, mustDocs(t, data)...)
		}
		if a, b := SortedKinds(emb), SortedKinds(disk); !slices.Equal(a, b) {
			t.Errorf("%s: embedded %q, on disk %q", dir, a, b)
		}
	}
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

// TestWorkerDaemonSet: the workers' DaemonSet is the gateways' pod with the worker config, on
// the nodes the gateways' does not take.
func TestWorkerDaemonSet(t *testing.T) {
	for name, m := range map[string]manifests{
		"deploy/daemonset (kustomize)": memberCluster(t),
		"cablectl install kubernetes":  installed(t, installValues),
	} {
		t.Run(name, func(t *testing.T) {
			gw, wk := m.daemonSets[0], m.daemonSets[1]
			if gw.Name != DaemonSetName || wk.Name != WorkerDaemonSetName {
				t.Fatalf("DaemonSets %s, %s: want %s, %s", gw.Name, wk.Name, DaemonSetName, WorkerDaemonSetName)
			}
			checkPodSpec(t, "DaemonSet "+wk.Name, wk.Spec.Template.Spec)
			if labelsMatch(gw.Spec.Selector.MatchLabels, wk.Spec.Template.Labels) || labelsMatch(wk.Spec.Selector.MatchLabels, gw.Spec.Template.Labels) {
				t.Errorf("the DaemonSets' selectors overlap (each would take the other's pods): %v, %v", gw.Spec.Selector, wk.Spec.Selector)
			}
			// The pods differ only where a worker must: the config key, the DaemonSet's name
			// (for the uninstall check), the placement and the labels.
			g, w := gw.Spec.Template.DeepCopy(), wk.Spec.Template.DeepCopy()
			ga, wa := container(t, g.Spec.Containers, AgentContainer), container(t, w.Spec.Containers, AgentContainer)
			if want := []string{"--config", "/etc/cablemesh/config/" + WorkerConfigKey}; !slices.Equal(wa.Args, want) {
				t.Errorf("worker args %q, want %q", wa.Args, want)
			}
			for _, ds := range []struct {
				name string
				c    corev1.Container
			}{{DaemonSetName, ga}, {WorkerDaemonSetName, wa}} {
				if !slices.ContainsFunc(ds.c.Env, func(e corev1.EnvVar) bool { return e.Name == "CABLEMESH_DAEMONSET" && e.Value == ds.name }) ||
					!slices.ContainsFunc(ds.c.Env, func(e corev1.EnvVar) bool {
						return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
					}) {
					t.Errorf("DaemonSet %s: the agent lacks CABLEMESH_DAEMONSET=%s or POD_NAMESPACE from the downward API: %+v", ds.name, ds.name, ds.c.Env)
				}
			}
			for _, p := range []*corev1.PodTemplateSpec{g, w} {
				p.Labels, p.Spec.NodeSelector, p.Spec.Affinity = nil, nil, nil
				c := &p.Spec.Containers[0]
				c.Args, c.Env = nil, slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "CABLEMESH_DAEMONSET" })
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("the worker's pod differs from the gateway's beyond args, env, labels and placement:\n%+v\n%+v", g, w)
			}

			cm := m.configMaps[0]
			gcfg := agentConfig(t, cm)
			raw := cm.Data[WorkerConfigKey]
			t.Setenv(config.NodeNameEnv, "node-2")
			wcfg, err := config.Parse([]byte(raw))
			if err != nil {
				t.Fatalf("the agent refuses %s: %v\n%s", WorkerConfigKey, err, raw)
			}
			if wcfg.Gateway || wcfg.Kubernetes.Enabled {
				t.Errorf("%s: gateway %v, kubernetes.enabled %v; want both false", WorkerConfigKey, wcfg.Gateway, wcfg.Kubernetes.Enabled)
			}
			if wcfg.Cluster != gcfg.Cluster || wcfg.Broker != gcfg.Broker || !slices.Equal(wcfg.PodCIDRs, gcfg.PodCIDRs) || !slices.Equal(wcfg.ServiceCIDRs, gcfg.ServiceCIDRs) ||
				wcfg.JoinTokenFile != gcfg.JoinTokenFile || wcfg.StateDir != gcfg.StateDir || wcfg.StatusSocket != gcfg.StatusSocket ||
				wcfg.BPFPinDir != gcfg.BPFPinDir || wcfg.CgroupPath != gcfg.CgroupPath || wcfg.MetricsAddress != gcfg.MetricsAddress {
				t.Errorf("the worker config differs from the gateway's beyond the role:\n%+v\n%+v", wcfg, gcfg)
			}
		})
	}
}

// TestWorkerPlacementIsTheGatewaysComplement: for every gateway selector the install accepts,
// each Linux node runs exactly one of the two DaemonSets.
func TestWorkerPlacementIsTheGatewaysComplement(t *testing.T) {
	nodes := []map[string]string{
		{}, {"cablemesh.io/gateway": "true"}, {"cablemesh.io/gateway": "false"}, {"role": "edge"}, {"role": "edge", "zone": "a"},
		{"role": "edge", "zone": "c"}, {"zone": "b", "spot": ""}, {"role": "core", "zone": "a"}, {"rank": "3"}, {"rank": "7"}, {"rank": "x"},
	}
	for _, sel := range []string{"", "role=edge,zone=a", "role=edge,zone in (a,b),!spot", "role!=core", "zone notin (a),spot", "rank>4", "rank<4"} {
		v := installValues
		v.GatewayNodes = sel
		m := installed(t, v)
		for _, n := range nodes {
			labels := map[string]string{"kubernetes.io/os": "linux"}
			for k, val := range n {
				labels[k] = val
			}
			gw, wk := runsOn(t, m.daemonSets[0].Spec.Template.Spec, labels), runsOn(t, m.daemonSets[1].Spec.Template.Spec, labels)
			exact := n["rank"] != "x" || !strings.Contains(sel, "rank")
			if gw == wk && exact {
				t.Errorf("selector %q, node %v: gateway DaemonSet %v, worker DaemonSet %v; want exactly one", sel, n, gw, wk)
			}
			if gw && wk {
				t.Errorf("selector %q, node %v: both DaemonSets run there", sel, n)
			}
		}
		if runsOn(t, m.daemonSets[1].Spec.Template.Spec, map[string]string{"kubernetes.io/os": "windows"}) {
			t.Errorf("selector %q: the worker DaemonSet runs on Windows nodes", sel)
		}
	}
}

// runsOn evaluates a pod's nodeSelector and required node affinity against a node's labels, as
// the scheduler does (terms ORed, expressions ANDed; NotIn and DoesNotExist match a node without
// the label).
func runsOn(t *testing.T, ps corev1.PodSpec, nodeLabels map[string]string) bool {
	t.Helper()
	set := k8slabels.Set(nodeLabels)
	for k, v := range ps.NodeSelector {
		if nodeLabels[k] != v {
			return false
		}
	}
	if ps.Affinity == nil || ps.Affinity.NodeAffinity == nil || ps.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	ops := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn, corev1.NodeSelectorOpExists: selection.Exists,
		corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist, corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
	}
	for _, term := range ps.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		all := true
		for _, e := range term.MatchExpressions {
			r, err := k8slabels.NewRequirement(e.Key, ops[e.Operator], e.Values)
			if err != nil {
				t.Fatalf("node affinity %+v: %v", e, err)
			}
			all = all && r.Matches(set)
		}
		if all {
			return true
		}
	}
	return false
}

// TestRollsSurgeBesideTheOldPod: a roll starts the new agent beside the old one, which hands the
// node over (agent/handover); with the Envoy ingress, whose listeners cannot be handed over, the
// old pod goes first.
func TestRollsSurgeBesideTheOldPod(t *testing.T) {
	surge := func(t *testing.T, ds *appsv1.DaemonSet) {
		t.Helper()
		ru := ds.Spec.UpdateStrategy.RollingUpdate
		if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil || ru.MaxSurge == nil || ru.MaxSurge.String() != "1" ||
			ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "0" {
			t.Errorf("DaemonSet %s rolls with %+v, want RollingUpdate maxSurge 1, maxUnavailable 0", ds.Name, ds.Spec.UpdateStrategy)
		}
	}
	for name, m := range map[string]manifests{
		"deploy/daemonset (kustomize)": memberCluster(t),
		"cablectl install kubernetes":  installed(t, installValues),
	} {
		t.Run(name, func(t *testing.T) {
			for _, ds := range m.daemonSets {
				surge(t, ds)
			}
		})
	}
	t.Run("with the Envoy ingress the gateways' old pod goes first", func(t *testing.T) {
		v := installValues
		v.IngressEnvoy = true
		m := installed(t, v)
		gw := m.daemonSets[0]
		ru := gw.Spec.UpdateStrategy.RollingUpdate
		if ru == nil || ru.MaxSurge != nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "1" {
			t.Errorf("DaemonSet %s with Envoy rolls with %+v, want maxUnavailable 1 and no surge", gw.Name, gw.Spec.UpdateStrategy)
		}
		surge(t, m.daemonSets[1]) // the workers run no Envoy
	})
}
