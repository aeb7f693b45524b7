// Package deploy holds the Kubernetes manifests (deploy/crds, deploy/daemonset, deploy/broker),
// embedded, and renders a member cluster's manifests with its values for `cablectl install
// kubernetes`; deploy/systemd holds the units `make install` lays down (scripts/install.sh). The files are the one source: kustomize reads them
// from disk, cablectl from the binary, and the tests decode both.
package deploy

import (
	"bufio"
	"bytes"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/agent/xds"
	"github.com/cablemesh/cablemesh/api/validation"
)

//go:embed crds/*.yaml daemonset/*.yaml broker/*.yaml
var files embed.FS

// Names of the objects the install renders and the code reads by name.
const (
	Namespace     = "cablemesh"
	ConfigMapName = "cable-agent-config"
	ConfigMapKey  = "agent.yaml"
	// WorkerConfigKey is the workers' agent config in the ConfigMap (gateway: false).
	WorkerConfigKey = "agent-worker.yaml"
	SecretName      = "cable-join-token"
	SecretKey       = "join-token"
	DaemonSetName   = "cable-agent"
	// WorkerDaemonSetName runs the agent on every Linux node the gateway selector leaves out.
	WorkerDaemonSetName = "cable-agent-worker"
	// GatewayLabel is the node label of the default gateway selector.
	GatewayLabel    = "cablemesh.io/gateway"
	AgentContainer  = "cable-agent"
	EnvoyContainer  = "envoy"
	ClusterLabel    = "cablemesh.io/cluster"
	DefaultGateways = "cablemesh.io/gateway=true"
	DefaultAgentTag = "cablemesh/cable-agent:v0.1.0"
	DefaultEnvoyTag = "envoyproxy/envoy:v1.34-latest"
	maxValueBytes   = 4096
)

// Object is one Kubernetes object as decoded from YAML.
type Object = map[string]any

// AgentValues are a member cluster's values.
type AgentValues struct {
	// Cluster is the cluster's name (a DNS label).
	Cluster string
	// Broker is what the agents dial: host:port, or several replicas' host:port,... .
	Broker string
	// PodCIDRs (at least one) and ServiceCIDRs of the cluster.
	PodCIDRs, ServiceCIDRs []string
	// GatewayNodes is a Kubernetes label selector choosing the nodes that run the agent as a
	// gateway; default DefaultGateways. Equality requirements go to the gateway pod's
	// nodeSelector, the others (!=, in, notin, exists, !key) to its required node affinity. The
	// worker DaemonSet runs on every other Linux node (the selector negated, workerPlacement).
	GatewayNodes string
	// JoinToken goes into the Secret SecretName (key SecretKey). Empty: no Secret is rendered
	// (uninstall, or a Secret made by other means).
	JoinToken string
	// Image is the agent's image; default DefaultAgentTag.
	Image string
	// IngressEnvoy adds the Envoy ingress container beside the agent (ingress.mode envoy).
	IngressEnvoy bool
	// EnvoyImage is the Envoy container's image; default DefaultEnvoyTag.
	EnvoyImage string
	// WithoutCRDs leaves the CRDs out (an uninstall that keeps other users' MCS objects).
	WithoutCRDs bool
}

// Validate checks the values before anything is rendered; errors name the field and value.
func (v *AgentValues) Validate() error {
	if err := validation.ValidateClusterName(v.Cluster); err != nil {
		return fmt.Errorf("cluster %q: %w", v.Cluster, err)
	}
	if err := checkBroker(v.Broker); err != nil {
		return err
	}
	if len(v.PodCIDRs) == 0 {
		return errors.New("pod CIDRs: at least one is required")
	}
	if _, err := validation.ParseCIDRs("pod CIDR", v.PodCIDRs); err != nil {
		return err
	}
	if _, err := validation.ParseCIDRs("service CIDR", v.ServiceCIDRs); err != nil {
		return err
	}
	if _, _, err := nodePlacement(v.gateways()); err != nil {
		return err
	}
	if _, err := workerPlacement(v.gateways()); err != nil {
		return err
	}
	for field, s := range map[string]string{"image": v.Image, "envoy image": v.EnvoyImage} {
		if len(s) > maxValueBytes || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || r == '\'' || r == '\\' || r > '~' }) {
			return fmt.Errorf("%s %q: not an image reference", field, s)
		}
	}
	if len(v.JoinToken) > maxValueBytes || strings.ContainsFunc(v.JoinToken, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return fmt.Errorf("join token: %d bytes with blanks or control characters, not a token", len(v.JoinToken))
	}
	return nil
}

func (v *AgentValues) gateways() string {
	if v.GatewayNodes == "" {
		return DefaultGateways
	}
	return v.GatewayNodes
}

// checkBroker accepts host:port[,host:port...] with plain host names or IPs: the value goes into
// the agent config as YAML text, so nothing that YAML would read differently may pass.
func checkBroker(s string) error {
	if s == "" {
		return errors.New("broker address: empty; give host:port")
	}
	if len(s) > maxValueBytes {
		return fmt.Errorf("broker address: %d bytes, at most %d", len(s), maxValueBytes)
	}
	for _, hp := range strings.Split(s, ",") {
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return fmt.Errorf("broker address %q: %v", hp, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("broker address %q: port %q is not 1..65535", hp, port)
		}
		if _, err := netip.ParseAddr(host); err == nil {
			continue
		}
		if host == "" || strings.ContainsFunc(host, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.')
		}) {
			return fmt.Errorf("broker address %q: host %q is neither an IP address nor a host name", hp, host)
		}
	}
	return nil
}

// Docs decodes every YAML document of the embedded files under dir (a kustomization.yaml aside),
// in file name order, comment-only documents skipped.
func Docs(dir string) ([]Object, error) {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, err
	}
	var out []Object
	for _, e := range entries {
		if e.IsDir() || e.Name() == "kustomization.yaml" || path.Ext(e.Name()) != ".yaml" {
			continue
		}
		data, err := fs.ReadFile(files, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		objs, err := DecodeDocs(data)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", dir, e.Name(), err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// DecodeDocs decodes a multi-document YAML stream into objects, skipping empty documents.
func DecodeDocs(data []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var o Object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(o) == 0 {
			continue
		}
		out = append(out, o)
	}
}

// AgentObjects renders a member cluster's objects: the CRDs (unless WithoutCRDs), the namespace,
// service account, RBAC, the agent config, the join token Secret (when JoinToken is set) and the
// DaemonSet, in the order kubectl apply needs them.
func AgentObjects(v AgentValues) ([]Object, error) {
	if err := v.Validate(); err != nil {
		return nil, err
	}
	var out []Object
	if !v.WithoutCRDs {
		crds, err := Docs("crds")
		if err != nil {
			return nil, err
		}
		out = append(out, crds...)
	}
	objs, err := Docs("daemonset")
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		setLabel(o, ClusterLabel, v.Cluster)
		switch kindName(o) {
		case "ConfigMap/" + ConfigMapName:
			if err := renderConfigMap(o, v); err != nil {
				return nil, err
			}
		case "DaemonSet/" + DaemonSetName:
			if err := renderDaemonSet(o, v); err != nil {
				return nil, err
			}
		case "DaemonSet/" + WorkerDaemonSetName:
			if err := renderWorkerDaemonSet(o, v); err != nil {
				return nil, err
			}
		}
		out = append(out, o)
		// The Secret and Envoy's bootstrap go before the DaemonSet that mounts them.
		if kindName(o) == "ConfigMap/"+ConfigMapName && v.JoinToken != "" {
			out = append(out, joinTokenSecret(v))
		}
		if kindName(o) == "ConfigMap/"+ConfigMapName && v.IngressEnvoy {
			b, err := envoyBootstrap(v)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
	}
	return out, nil
}

// AgentManifests is AgentObjects as one multi-document YAML stream.
func AgentManifests(v AgentValues) ([]byte, error) {
	objs, err := AgentObjects(v)
	if err != nil {
		return nil, err
	}
	return Encode(objs)
}

// Encode writes objects as a multi-document YAML stream.
func Encode(objs []Object) ([]byte, error) {
	var buf bytes.Buffer
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", kindName(o), err)
		}
		buf.WriteString("---\n")
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

func kindName(o Object) string {
	kind, _ := o["kind"].(string)
	name, _ := nested(o, "metadata")["name"].(string)
	return kind + "/" + name
}

// nested returns the map at the path, creating it where absent.
func nested(o Object, keys ...string) map[string]any {
	m := o
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	return m
}

func setLabel(o Object, k, v string) {
	if o["kind"] == "CustomResourceDefinition" {
		return // shared by every user of the API, not this cluster's
	}
	nested(o, "metadata", "labels")[k] = v
}

func joinTokenSecret(v AgentValues) Object {
	return Object{
		"apiVersion": "v1",
		"kind":       "Secret",
		"type":       "Opaque",
		"metadata": map[string]any{
			"name":      SecretName,
			"namespace": Namespace,
			"labels": map[string]any{
				"app.kubernetes.io/name":    "cable-agent",
				"app.kubernetes.io/part-of": "cablemesh",
				ClusterLabel:                v.Cluster,
			},
		},
		"data": map[string]any{SecretKey: base64.StdEncoding.EncodeToString([]byte(v.JoinToken))},
	}
}

// renderConfigMap fills in the cluster's values in the gateways' and the workers' configs.
func renderConfigMap(o Object, v AgentValues) error {
	data := nested(o, "data")
	for _, key := range []string{ConfigMapKey, WorkerConfigKey} {
		text, ok := data[key].(string)
		if !ok {
			return fmt.Errorf("deploy: the ConfigMap template has no %s", key)
		}
		text, err := renderAgentConfig(text, v, key == ConfigMapKey)
		if err != nil {
			return fmt.Errorf("deploy: %s: %w", key, err)
		}
		data[key] = text
	}
	return nil
}

// renderAgentConfig sets the cluster's values in one agent config text; the Envoy ingress is the
// gateways' only.
func renderAgentConfig(text string, v AgentValues, gateway bool) (string, error) {
	pods, _ := validation.ParseCIDRs("pod CIDR", v.PodCIDRs)
	svcs, _ := validation.ParseCIDRs("service CIDR", v.ServiceCIDRs)
	var err error
	// JSON strings and arrays are YAML: quoted, a cluster named "null" or "123" stays a string.
	for _, kv := range []struct {
		key string
		val any
	}{
		{"cluster", v.Cluster},
		{"broker", v.Broker},
		{"podCIDRs", validation.Strings(pods)},
	} {
		if text, err = setConfigKey(text, kv.key, jsonText(kv.val)); err != nil {
			return "", err
		}
	}
	if len(svcs) > 0 {
		text = insertAfter(text, "podCIDRs", "serviceCIDRs: "+jsonText(validation.Strings(svcs)))
	}
	if v.IngressEnvoy && gateway {
		if strings.Contains(text, "\ningress:") {
			return "", errors.New("the agent config template already has an ingress block")
		}
		text = strings.TrimSuffix(text, "\n") + "\n" + ingressEnvoyLine + "\n"
	}
	return text, nil
}

func jsonText(v any) string {
	b, _ := json.Marshal(v) // strings and string slices always marshal
	return string(b)
}

// setConfigKey replaces the value of the top-level key in the agent config text. The template
// has each key once, on its own line (deploy tests check it).
func setConfigKey(text, key, value string) (string, error) {
	lines := strings.Split(text, "\n")
	found := false
	for i, l := range lines {
		if strings.HasPrefix(l, key+":") {
			lines[i] = key + ": " + value
			found = true
		}
	}
	if !found {
		return "", fmt.Errorf("deploy: the agent config template has no %s line", key)
	}
	return strings.Join(lines, "\n"), nil
}

func insertAfter(text, key, line string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, key+":") {
			return strings.Join(slices.Insert(lines, i+1, line), "\n")
		}
	}
	return text + line + "\n"
}

func renderDaemonSet(o Object, v AgentValues) error {
	pod := nested(o, "spec", "template", "spec")
	nodeSel, exprs, err := nodePlacement(v.gateways())
	if err != nil {
		return err
	}
	pod["nodeSelector"] = nodeSel
	if len(exprs) > 0 {
		pod["affinity"] = map[string]any{"nodeAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
				"nodeSelectorTerms": []any{map[string]any{"matchExpressions": exprs}},
			},
		}}
	}
	containers, _ := pod["containers"].([]any)
	for _, c := range containers {
		c, _ := c.(map[string]any)
		if c["name"] == AgentContainer && v.Image != "" {
			c["image"] = v.Image
		}
	}
	if v.IngressEnvoy {
		// Envoy cannot take a node's listeners over from another pod's Envoy (its hot restart
		// needs the two in one IPC namespace): the old pod goes before the new one starts.
		nested(o, "spec")["updateStrategy"] = map[string]any{"type": "RollingUpdate",
			"rollingUpdate": map[string]any{"maxUnavailable": 1}}
		pod["containers"] = append(containers, envoyContainer(v))
		vols, _ := pod["volumes"].([]any)
		pod["volumes"] = append(vols, map[string]any{"name": "envoy-bootstrap", "configMap": map[string]any{"name": EnvoyConfigMap}})
	}
	return nil
}

// renderWorkerDaemonSet places the workers on every Linux node that is not a gateway and sets
// the image; the template's own placement is the default selector's.
func renderWorkerDaemonSet(o Object, v AgentValues) error {
	pod := nested(o, "spec", "template", "spec")
	terms, err := workerPlacement(v.gateways())
	if err != nil {
		return err
	}
	pod["nodeSelector"] = map[string]any{"kubernetes.io/os": "linux"}
	pod["affinity"] = map[string]any{"nodeAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": terms},
	}}
	containers, _ := pod["containers"].([]any)
	for _, c := range containers {
		c, _ := c.(map[string]any)
		if c["name"] == AgentContainer && v.Image != "" {
			c["image"] = v.Image
		}
	}
	return nil
}

// The Envoy ingress (AgentValues.IngressEnvoy): the agent serves xDS on a unix socket in
// /run/cablemesh, which the Envoy container mounts too.
const (
	// ingressEnvoyLine is what the gateways' agent config gets with the Envoy ingress.
	ingressEnvoyLine = "ingress: {mode: envoy, xds: {listen: " + EnvoyXDSSocket + "}}"
	EnvoyConfigMap   = "cable-envoy-bootstrap"
	EnvoyXDSSocket   = "/run/cablemesh/xds.sock"
	envoyAdminListen = "127.0.0.1:9901"
	envoyAdminPort   = 9901
)

// envoyBootstrap is the bootstrap `cable-agent envoy-bootstrap` prints for the config the
// install renders (the same xds.Bootstrap). Its node id is a placeholder: each pod's Envoy is
// started with --service-node <node>-ingress, which overrides it.
func envoyBootstrap(v AgentValues) (Object, error) {
	y, err := envoyBootstrapText(jsonText(v.Cluster))
	if err != nil {
		return nil, err
	}
	return Object{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata": map[string]any{
			"name":      EnvoyConfigMap,
			"namespace": Namespace,
			"labels":    map[string]any{"app.kubernetes.io/name": "cable-agent", "app.kubernetes.io/part-of": "cablemesh", ClusterLabel: v.Cluster},
		},
		"data": map[string]any{"envoy.yaml": y},
	}, nil
}

// bootstrapClusterMark stands for the cluster's name while the bootstrap is marshalled: the name
// then goes in as a JSON string (as the agent config's values do), so its text is the same whoever
// renders it (cablectl here, the Helm chart with toJson) and a cluster named "123" stays a string.
const bootstrapClusterMark = "cablemesh-bootstrap-cluster-mark"

// envoyBootstrapText is Envoy's bootstrap as YAML text with clusterYAML (a YAML scalar) as its
// node's cluster.
func envoyBootstrapText(clusterYAML string) (string, error) {
	b, err := xds.Bootstrap(xds.BootstrapOptions{NodeID: "ingress", NodeCluster: bootstrapClusterMark, Network: "unix", Address: EnvoyXDSSocket, AdminAddress: envoyAdminListen})
	if err != nil {
		return "", err
	}
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return "", err
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		return "", err
	}
	line := "cluster: " + bootstrapClusterMark + "\n"
	if n := bytes.Count(y, []byte(line)); n != 1 {
		return "", fmt.Errorf("deploy: Envoy's bootstrap names its node's cluster %d times, want once", n)
	}
	return string(bytes.Replace(y, []byte(line), []byte("cluster: "+clusterYAML+"\n"), 1)), nil
}

func envoyContainer(v AgentValues) map[string]any {
	img := v.EnvoyImage
	if img == "" {
		img = DefaultEnvoyTag
	}
	// Envoy's admin listens on the node's loopback (host network): the kubelet probes it there.
	probe := func(path string) map[string]any {
		return map[string]any{"httpGet": map[string]any{"host": "127.0.0.1", "port": envoyAdminPort, "path": path}, "periodSeconds": 10}
	}
	return map[string]any{
		"name":  EnvoyContainer,
		"image": img,
		// $(NODE_NAME) is expanded by the kubelet: the xDS server tells Envoys apart by node id.
		"command": []any{"envoy", "-c", "/etc/envoy/envoy.yaml", "--service-node", "$(NODE_NAME)-ingress", "--service-cluster", v.Cluster, "--log-level", "warn"},
		"env":     []any{map[string]any{"name": "NODE_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "spec.nodeName"}}}},
		"volumeMounts": []any{
			map[string]any{"name": "envoy-bootstrap", "mountPath": "/etc/envoy", "readOnly": true},
			map[string]any{"name": "run", "mountPath": "/run/cablemesh"},
		},
		"readinessProbe": probe("/ready"),
		"livenessProbe":  probe("/server_info"),
		"resources": map[string]any{
			"requests": map[string]any{"cpu": "50m", "memory": "64Mi"},
			"limits":   map[string]any{"memory": "512Mi"},
		},
		"securityContext": restricted(),
	}
}

// restricted is a container security context with nothing added: Envoy binds the ingress ports
// (above 1024) and needs no capability.
func restricted() map[string]any {
	return map[string]any{
		"privileged":               false,
		"allowPrivilegeEscalation": false,
		"readOnlyRootFilesystem":   true,
		"capabilities":             map[string]any{"drop": []any{"ALL"}},
	}
}

// SortedKinds lists "Kind/name" of objects, for messages and tests.
func SortedKinds(objs []Object) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, kindName(o))
	}
	sort.Strings(out)
	return out
}
