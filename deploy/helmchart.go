package deploy

// The Helm chart deploy/helm/cablemesh is generated from the embedded templates by the same
// rendering code as `cablectl install kubernetes` (AgentObjects): the objects are rendered with
// marker values that pass Validate and appear nowhere else, and each marker, or each field the
// chart makes a value of, is then replaced by the Helm template expression that yields the
// operator's value. So the chart has no YAML of its own to drift: regenerate it with
//
//	go generate ./deploy
//
// and TestHelmChartIsGenerated fails while the files in the repository are not what this code
// generates; tests/helm renders the chart with Helm's own packages and checks that it equals
// AgentObjects, object for object, for the same settings. See docs/helm.md.

//go:generate go run ./helmgen helm/cablemesh

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// HelmChartDir is the chart's directory, relative to deploy/.
const HelmChartDir = "helm/cablemesh"

// Marker values: each passes Validate and appears nowhere in the templates, so each occurrence
// in the rendered objects is the place of one chart value.
const (
	markCluster    = "zzhelmcluster"
	markBroker     = "zzhelmbroker:1"
	markPodCIDR    = "198.51.100.0/24"
	markSvcCIDR    = "203.0.113.0/24"
	markImage      = "zzhelm/agent:image"
	markEnvoyImage = "zzhelm/envoy:image"
	markGateway    = "zzhelm-gateway=x"
	// placeholderPrefix marks a field whose whole value the chart makes (placeholder).
	placeholderPrefix = "__HELM_"
)

// Template expressions of the chart's values.
const (
	exprCluster    = `{{ .Values.cluster | toJson }}`
	exprBroker     = `{{ .Values.broker | toJson }}`
	exprPodCIDRs   = `{{ .Values.podCIDRs | toJson }}`
	exprImage      = `{{ printf "%s:%s" .Values.image.repository .Values.image.tag | toJson }}`
	exprEnvoyImage = `{{ printf "%s:%s" .Values.ingress.envoy.image.repository .Values.ingress.envoy.image.tag | toJson }}`
	ifEnvoy        = `{{- if .Values.ingress.envoy.enabled }}`
	ifWorkers      = `{{- if .Values.workers.enabled }}`
	tplElse        = `{{- else }}`
	tplEnd         = `{{- end }}`
	// gatewaySelector is the gateways' node selector: gateway.nodeSelector, or the default when
	// empty (a default in values.yaml would be merged with, not replaced by, the operator's).
	gatewaySelector = `include "cablemesh.gatewayNodeSelector" . | fromJson`
)

// chartDefaults are the chart's default values, read from the templates so that the chart's
// defaults render what cablectl renders.
type chartDefaults struct {
	imageRepo, imageTag, pullPolicy string
	envoyRepo, envoyTag             string
	gatewayNodeSelector             map[string]any
	cableDrivers                    []string
	tolerations                     []any
	resources                       map[string]any
	drivers                         []string // every driver the policy CRD knows
}

// HelmChart returns the chart's files by path relative to the chart's directory.
func HelmChart() (map[string][]byte, error) {
	d, err := readChartDefaults()
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	values := AgentValues{Cluster: markCluster, Broker: markBroker, PodCIDRs: []string{markPodCIDR},
		ServiceCIDRs: []string{markSvcCIDR}, GatewayNodes: markGateway, Image: markImage,
		EnvoyImage: markEnvoyImage, WithoutCRDs: true}
	withEnvoy := values
	withEnvoy.IngressEnvoy = true
	on, err := templatedObjects(withEnvoy, d)
	if err != nil {
		return nil, err
	}
	off, err := templatedObjects(values, d)
	if err != nil {
		return nil, err
	}
	for i, t := range on {
		text := t.text
		if j := slices.IndexFunc(off, func(o templated) bool { return o.kindName == t.kindName }); j < 0 {
			text = ifEnvoy + "\n" + t.text + tplEnd + "\n"
		} else if off[j].text != t.text {
			text = ifEnvoy + "\n" + t.text + tplElse + "\n" + off[j].text + tplEnd + "\n"
		}
		if t.kindName == "DaemonSet/"+WorkerDaemonSetName {
			text = ifWorkers + "\n" + text + tplEnd + "\n"
		}
		kind, name, _ := strings.Cut(t.kindName, "/")
		out[fmt.Sprintf("templates/%02d-%s-%s.yaml", i, strings.ToLower(kind), name)] = []byte(generatedHeader + text)
	}
	if len(off) > len(on) {
		return nil, errors.New("deploy: the objects without the Envoy ingress are not a subset of those with it")
	}
	crds, err := fs.ReadDir(files, "crds")
	if err != nil {
		return nil, err
	}
	for _, e := range crds {
		if e.Name() == "kustomization.yaml" {
			continue
		}
		b, err := fs.ReadFile(files, path.Join("crds", e.Name()))
		if err != nil {
			return nil, err
		}
		out["crds/"+e.Name()] = b
	}
	for name, f := range map[string]func(chartDefaults) ([]byte, error){
		"Chart.yaml":         chartYAML,
		"values.yaml":        valuesYAML,
		"values.schema.json": valuesSchema,
		"templates/NOTES.txt": func(chartDefaults) ([]byte, error) {
			return []byte(notesTxt), nil
		},
		"templates/_helpers.tpl": helpersTpl,
	} {
		b, err := f(d)
		if err != nil {
			return nil, fmt.Errorf("deploy: chart %s: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}

const generatedHeader = "# Generated by `go generate ./deploy` from deploy/daemonset (deploy/helmchart.go): do not edit.\n" +
	`{{- include "cablemesh.checks" . }}` + "\n"

type templated struct {
	kindName, text string
}

// templatedObjects renders the member cluster's objects with the marker values and turns each
// into template text.
func templatedObjects(v AgentValues, d chartDefaults) ([]templated, error) {
	objs, err := AgentObjects(v)
	if err != nil {
		return nil, err
	}
	var out []templated
	for _, o := range objs {
		p := &placeholders{}
		if err := placeValues(o, p, d); err != nil {
			return nil, fmt.Errorf("deploy: chart %s: %w", kindName(o), err)
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		text, err := p.substitute(string(b))
		if err != nil {
			return nil, fmt.Errorf("deploy: chart %s: %w", kindName(o), err)
		}
		text = replaceMarks(text)
		for _, m := range []string{markCluster, markBroker, markPodCIDR, markSvcCIDR, markImage, markEnvoyImage, "zzhelm", placeholderPrefix} {
			if strings.Contains(text, m) {
				return nil, fmt.Errorf("deploy: chart %s: the marker %q is left in the template", kindName(o), m)
			}
		}
		out = append(out, templated{kindName: kindName(o), text: "---\n" + text})
	}
	return out, nil
}

// replaceMarks puts the values' expressions in the markers' places: quoted forms (in the agent
// config, where cablectl writes JSON strings) before bare ones.
func replaceMarks(text string) string {
	return strings.NewReplacer(
		jsonText(markCluster), exprCluster,
		markCluster, exprCluster,
		jsonText(markBroker), exprBroker,
		jsonText([]string{markPodCIDR}), exprPodCIDRs,
		markImage, exprImage,
		markEnvoyImage, exprEnvoyImage,
	).Replace(text)
}

// placeValues swaps the fields the chart makes values of for placeholders.
func placeValues(o Object, p *placeholders, d chartDefaults) error {
	switch kindName(o) {
	case "ConfigMap/" + ConfigMapName:
		data := nested(o, "data")
		for _, key := range []string{ConfigMapKey, WorkerConfigKey} {
			text, _ := data[key].(string)
			lines, err := configTemplate(text, d)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			// Rendered without the ingress, the gateways' config gets its condition all the same:
			// one ConfigMap template for both.
			if key == ConfigMapKey && !slices.Contains(lines, ingressEnvoyLine) {
				lines = append(lines, ifEnvoy, ingressEnvoyLine, tplEnd)
			}
			data[key] = p.add(" |", lines...)
		}
	case "DaemonSet/" + DaemonSetName:
		pod := nested(o, "spec", "template", "spec")
		if _, ok := pod["affinity"]; ok {
			return errors.New("the gateways' pod has a node affinity, which the chart's gateway.nodeSelector cannot make")
		}
		pod["nodeSelector"] = p.block(`mergeOverwrite (dict "kubernetes.io/os" "linux") (` + gatewaySelector + `)`)
		return placePodValues(pod, p, d)
	case "DaemonSet/" + WorkerDaemonSetName:
		pod := nested(o, "spec", "template", "spec")
		// The gateways' selector negated (workerPlacement): one term per label, ORed.
		pod["affinity"] = p.add("",
			"nodeAffinity:",
			"  requiredDuringSchedulingIgnoredDuringExecution:",
			"    nodeSelectorTerms:",
			"      {{- range $key, $value := "+gatewaySelector+" }}",
			"      - matchExpressions:",
			"          - key: {{ $key | toJson }}",
			"            operator: NotIn",
			"            values: [{{ $value | toJson }}]",
			"      {{- end }}")
		return placePodValues(pod, p, d)
	}
	return nil
}

// placePodValues swaps the agent container's pull policy and resources, the pod's tolerations
// and the join token's Secret for the chart's values, after checking that the template's are
// the chart's defaults (so the defaults render what cablectl renders).
func placePodValues(pod map[string]any, p *placeholders, d chartDefaults) error {
	if !jsonEqual(pod["tolerations"], d.tolerations) {
		return errors.New("the pod's tolerations are not the chart's default tolerations (the gateways')")
	}
	pod["tolerations"] = p.block(".Values.tolerations")
	agent := agentContainer(pod)
	if agent == nil {
		return fmt.Errorf("no container %s", AgentContainer)
	}
	if !jsonEqual(agent["resources"], d.resources) || agent["imagePullPolicy"] != d.pullPolicy {
		return errors.New("the agent container's resources or pull policy are not the chart's defaults (the gateways')")
	}
	agent["resources"] = p.block(".Values.resources")
	agent["imagePullPolicy"] = p.add(" {{ .Values.image.pullPolicy | toJson }}")
	vols, _ := pod["volumes"].([]any)
	for _, vol := range vols {
		vol, _ := vol.(map[string]any)
		secret, _ := vol["secret"].(map[string]any)
		if vol["name"] != "join-token" || secret == nil {
			continue
		}
		if secret["secretName"] != SecretName || len(secret) != 2 {
			return fmt.Errorf("the join-token volume is not the Secret %s with a default mode: %v", SecretName, secret)
		}
		mode, _ := secret["defaultMode"].(float64)
		// The agent reads the token from the file named SecretKey, whatever the Secret's key.
		vol["secret"] = p.add("",
			"secretName: {{ .Values.joinToken.existingSecret | toJson }}",
			"defaultMode: "+strconv.FormatFloat(mode, 'f', -1, 64),
			`{{- if ne .Values.joinToken.key "`+SecretKey+`" }}`,
			"items:",
			"  - key: {{ .Values.joinToken.key | toJson }}",
			"    path: "+SecretKey,
			tplEnd)
		return nil
	}
	return errors.New("no join-token Secret volume")
}

func agentContainer(pod map[string]any) map[string]any {
	cs, _ := pod["containers"].([]any)
	for _, c := range cs {
		if c, _ := c.(map[string]any); c["name"] == AgentContainer {
			return c
		}
	}
	return nil
}

func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

// configTemplate turns an agent config rendered with the marker values into template lines.
func configTemplate(text string, d chartDefaults) ([]string, error) {
	drivers := "cableDrivers: [" + strings.Join(d.cableDrivers, ", ") + "]"
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		switch {
		case l == "serviceCIDRs: "+jsonText([]string{markSvcCIDR}):
			out = append(out, "{{- with .Values.serviceCIDRs }}", "serviceCIDRs: {{ toJson . }}", tplEnd)
		case l == ingressEnvoyLine:
			out = append(out, ifEnvoy, l, tplEnd)
		case strings.HasPrefix(l, "cableDrivers:"):
			// Written as the template writes it, so the defaults render the same text.
			if l != drivers {
				return nil, fmt.Errorf("the template's %q is not written as %q", l, drivers)
			}
			out = append(out, `cableDrivers: [{{ join ", " .Values.cableDrivers }}]`)
		default:
			out = append(out, l)
		}
	}
	return out, nil
}

// placeholders are the fields whose whole value the chart makes: a field's value is set to
// __HELM_<n>__, marshalled, and the line then replaced by the field's key, a suffix and its
// lines, indented below the key.
type placeholders struct {
	fields []placeholder
}

type placeholder struct {
	suffix string   // after "key:" on the key's line
	lines  []string // below the key, indented two more than the key
}

func (p *placeholders) add(suffix string, lines ...string) string {
	p.fields = append(p.fields, placeholder{suffix: suffix, lines: lines})
	return placeholderPrefix + strconv.Itoa(len(p.fields)-1) + "__"
}

// block is a field whose value is the YAML of a template expression.
func (p *placeholders) block(expr string) string {
	return p.add("", "{{- toYaml ("+expr+") | nindent @ }}")
}

var placeholderLine = regexp.MustCompile(`^( *)(- )?([^ ][^:]*): ` + placeholderPrefix + `(\d+)__$`)

func (p *placeholders) substitute(text string) (string, error) {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		m := placeholderLine.FindStringSubmatch(l)
		if m == nil {
			out = append(out, l)
			continue
		}
		n, _ := strconv.Atoi(m[4])
		if n >= len(p.fields) {
			return "", fmt.Errorf("placeholder %d unknown", n)
		}
		f := p.fields[n]
		indent := len(m[1]) + len(m[2]) + 2
		out = append(out, m[1]+m[2]+m[3]+":"+f.suffix)
		for _, fl := range f.lines {
			fl = strings.ReplaceAll(fl, "nindent @", "nindent "+strconv.Itoa(indent))
			if strings.HasPrefix(fl, "{{- toYaml") {
				out = append(out, fl) // nindent places it
				continue
			}
			out = append(out, strings.Repeat(" ", indent)+fl)
		}
	}
	return strings.Join(out, "\n"), nil
}

// readChartDefaults reads the chart's defaults from the templates.
func readChartDefaults() (chartDefaults, error) {
	var d chartDefaults
	objs, err := Docs("daemonset")
	if err != nil {
		return d, err
	}
	for _, o := range objs {
		switch kindName(o) {
		case "DaemonSet/" + DaemonSetName:
			pod := nested(o, "spec", "template", "spec")
			d.tolerations, _ = pod["tolerations"].([]any)
			agent := agentContainer(pod)
			if agent == nil {
				return d, fmt.Errorf("deploy: %s has no container %s", DaemonSetName, AgentContainer)
			}
			d.resources, _ = agent["resources"].(map[string]any)
			d.pullPolicy, _ = agent["imagePullPolicy"].(string)
		case "ConfigMap/" + ConfigMapName:
			text, _ := nested(o, "data")[ConfigMapKey].(string)
			var cfg struct {
				CableDrivers []string `json:"cableDrivers"`
			}
			if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
				return d, fmt.Errorf("deploy: %s: %w", ConfigMapKey, err)
			}
			d.cableDrivers = cfg.CableDrivers
		}
	}
	if d.tolerations == nil || d.resources == nil || d.pullPolicy == "" || len(d.cableDrivers) == 0 {
		return d, errors.New("deploy: the templates lack the gateway DaemonSet's tolerations, resources or pull policy, or the cable drivers")
	}
	if d.imageRepo, d.imageTag, err = splitImage(DefaultAgentTag); err != nil {
		return d, err
	}
	if d.envoyRepo, d.envoyTag, err = splitImage(DefaultEnvoyTag); err != nil {
		return d, err
	}
	sel, _, err := nodePlacement(DefaultGateways)
	if err != nil {
		return d, err
	}
	delete(sel, "kubernetes.io/os")
	d.gatewayNodeSelector = sel
	d.drivers, err = policyDrivers()
	return d, err
}

// splitImage splits repository:tag (the tag after the last '/').
func splitImage(ref string) (string, string, error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return "", "", fmt.Errorf("deploy: image %q has no tag", ref)
	}
	return ref[:i], ref[i+1:], nil
}

// policyDrivers reads the cable drivers the ClusterConnectionPolicy CRD allows (deploy tests
// check that list is the driver registry's).
func policyDrivers() ([]string, error) {
	data, err := fs.ReadFile(files, "crds/cablemesh.io_clusterconnectionpolicies.yaml")
	if err != nil {
		return nil, err
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties struct {
									CableDriver struct {
										Properties struct {
											Name struct {
												Enum []string `json:"enum"`
											} `json:"name"`
										} `json:"properties"`
									} `json:"cableDriver"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		return nil, err
	}
	if len(crd.Spec.Versions) == 0 || len(crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties.CableDriver.Properties.Name.Enum) == 0 {
		return nil, errors.New("deploy: the ClusterConnectionPolicy CRD lists no cable drivers")
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties.CableDriver.Properties.Name.Enum, nil
}
