// Command nodeagents adapts the output of `cablectl install kubernetes` (or `uninstall`) to the
// clusters of tests/k8s, reading it on stdin and writing it to stdout, for `kubectl apply -f -`:
//
//		nodeagents [-cgroup-path PATH] [-dns-listen ADDR] [-workers]
//
//	  - -cgroup-path sets the agent config's cgroupPath: on a hybrid cgroup host such as this one
//	    the node's cgroup2 is /sys/fs/cgroup/unified (cluster.sh gives every node its own there),
//	    so the DaemonSet's mount of the host's /sys/fs/cgroup holds it at
//	    /host/sys/fs/cgroup/unified. On a node whose /sys/fs/cgroup is cgroup2 nothing changes.
//	  - -dns-listen sets dns.listen (the clusterset.local server the test pods query).
//	  - -workers adds the agents of the non-gateway nodes, which the install does not render: the
//	    ConfigMap cable-agent-worker-config (the same config with gateway: false and without the
//	    Kubernetes exports, which the gateway makes) and the DaemonSet cable-agent-worker, a copy
//	    of cable-agent on the nodes labelled cablemesh.io/gateway=false. They route the remote
//	    clusters' CIDRs via the cluster's gateway, as a worker agent does anywhere.
//
// Every other object passes through unchanged.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	configMapName   = "cable-agent-config"
	configKey       = "agent.yaml"
	daemonSetName   = "cable-agent"
	workerName      = "cable-agent-worker"
	workerConfigMap = "cable-agent-worker-config"
	gatewayLabel    = "cablemesh.io/gateway"
)

type object = map[string]any

func main() {
	cgroupPath := flag.String("cgroup-path", "", "the agent config's cgroupPath (empty: as rendered)")
	dnsListen := flag.String("dns-listen", "", "the agent config's dns.listen (empty: as rendered)")
	workers := flag.Bool("workers", false, "add the non-gateway nodes' agents")
	flag.Parse()
	objs, err := decode(os.Stdin)
	if err == nil {
		objs, err = adapt(objs, *cgroupPath, *dnsListen, *workers)
	}
	if err == nil {
		err = encode(os.Stdout, objs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeagents:", err)
		os.Exit(1)
	}
}

func decode(r io.Reader) ([]object, error) {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objs []object
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the manifests: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("decode a manifest: %w", err)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
}

func encode(w io.Writer, objs []object) error {
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
			return err
		}
	}
	return nil
}

func named(o object, kind, name string) bool {
	md, _ := o["metadata"].(map[string]any)
	return o["kind"] == kind && md != nil && md["name"] == name
}

func adapt(objs []object, cgroupPath, dnsListen string, workers bool) ([]object, error) {
	var out, extra []object
	for _, o := range objs {
		switch {
		case named(o, "ConfigMap", configMapName):
			if data, ok := o["data"].(map[string]any); ok {
				if _, has := data[configKey]; has {
					cfg, err := editConfig(data, func(c object) {
						if cgroupPath != "" {
							c["cgroupPath"] = cgroupPath
						}
						if dnsListen != "" {
							dns, _ := c["dns"].(map[string]any)
							if dns == nil {
								dns = map[string]any{}
							}
							dns["listen"] = dnsListen
							c["dns"] = dns
						}
					})
					if err != nil {
						return nil, err
					}
					data[configKey] = cfg
					if workers {
						w, err := workerConfig(o)
						if err != nil {
							return nil, err
						}
						extra = append(extra, w)
					}
				}
			}
		case named(o, "DaemonSet", daemonSetName) && workers:
			w, err := workerDaemonSet(o)
			if err != nil {
				return nil, err
			}
			extra = append(extra, w)
		}
		out = append(out, o)
	}
	return append(out, extra...), nil
}

// editConfig applies edit to the agent config held in data[configKey] and returns it re-encoded.
func editConfig(data map[string]any, edit func(object)) (string, error) {
	text, _ := data[configKey].(string)
	var cfg object
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		return "", fmt.Errorf("ConfigMap %s: %s: %w", configMapName, configKey, err)
	}
	if cfg == nil {
		cfg = object{}
	}
	edit(cfg)
	b, err := yaml.Marshal(cfg)
	return string(b), err
}

func deepCopy(o object) (object, error) {
	b, err := yaml.Marshal(o)
	if err != nil {
		return nil, err
	}
	var c object
	return c, yaml.Unmarshal(b, &c)
}

func workerConfig(gateway object) (object, error) {
	w, err := deepCopy(gateway)
	if err != nil {
		return nil, err
	}
	w["metadata"].(map[string]any)["name"] = workerConfigMap
	delete(w["metadata"].(map[string]any), "annotations")
	data := w["data"].(map[string]any)
	cfg, err := editConfig(data, func(c object) {
		c["gateway"] = false
		c["kubernetes"] = map[string]any{"enabled": false}
	})
	if err != nil {
		return nil, err
	}
	data[configKey] = cfg
	return w, nil
}

func workerDaemonSet(gateway object) (object, error) {
	w, err := deepCopy(gateway)
	if err != nil {
		return nil, err
	}
	md := w["metadata"].(map[string]any)
	md["name"] = workerName
	if l, ok := md["labels"].(map[string]any); ok {
		l["app.kubernetes.io/name"] = workerName
	}
	spec, _ := w["spec"].(map[string]any)
	sel, _ := spec["selector"].(map[string]any)
	ml, _ := sel["matchLabels"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	tmd, _ := tmpl["metadata"].(map[string]any)
	tl, _ := tmd["labels"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	if ml == nil || tl == nil || pod == nil {
		return nil, fmt.Errorf("DaemonSet %s: no selector, template labels or pod spec", daemonSetName)
	}
	ml["app.kubernetes.io/name"] = workerName
	tl["app.kubernetes.io/name"] = workerName
	pod["nodeSelector"] = map[string]any{"kubernetes.io/os": "linux", gatewayLabel: "false"}
	delete(pod, "affinity")
	vols, _ := pod["volumes"].([]any)
	for _, v := range vols {
		vm, _ := v.(map[string]any)
		if cm, ok := vm["configMap"].(map[string]any); ok && cm["name"] == configMapName {
			cm["name"] = workerConfigMap
		}
	}
	return w, nil
}
