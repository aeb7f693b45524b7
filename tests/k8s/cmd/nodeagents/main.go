// Command nodeagents adapts the output of `cablectl install kubernetes` (or `uninstall`) to the
// clusters of tests/k8s, reading it on stdin and writing it to stdout, for `kubectl apply -f -`:
//
//		nodeagents [-cgroup-path PATH] [-dns-listen ADDR]
//
//	  - -cgroup-path sets the agent configs' cgroupPath: on a hybrid cgroup host such as this one
//	    the node's cgroup2 is /sys/fs/cgroup/unified (cluster.sh gives every node its own there),
//	    so the DaemonSets' mount of the host's /sys/fs/cgroup holds it at
//	    /host/sys/fs/cgroup/unified. On a node whose /sys/fs/cgroup is cgroup2 nothing changes.
//	  - -dns-listen sets dns.listen (the clusterset.local server the test pods query).
//
// Both change the gateways' (agent.yaml) and the workers' (agent-worker.yaml) configs of the
// ConfigMap alike: the install renders both agents itself. Every other object passes through
// unchanged.
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
	workerConfigKey = "agent-worker.yaml"
)

type object = map[string]any

func main() {
	cgroupPath := flag.String("cgroup-path", "", "the agent config's cgroupPath (empty: as rendered)")
	dnsListen := flag.String("dns-listen", "", "the agent config's dns.listen (empty: as rendered)")
	flag.Parse()
	objs, err := decode(os.Stdin)
	if err == nil {
		objs, err = adapt(objs, *cgroupPath, *dnsListen)
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

func adapt(objs []object, cgroupPath, dnsListen string) ([]object, error) {
	for _, o := range objs {
		if !named(o, "ConfigMap", configMapName) {
			continue
		}
		data, ok := o["data"].(map[string]any)
		if !ok {
			continue
		}
		for _, key := range []string{configKey, workerConfigKey} {
			if _, has := data[key]; !has {
				continue
			}
			cfg, err := editConfig(data, key, func(c object) {
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
			data[key] = cfg
		}
	}
	return objs, nil
}

// editConfig applies edit to the agent config held in data[key] and returns it re-encoded.
func editConfig(data map[string]any, key string, edit func(object)) (string, error) {
	text, _ := data[key].(string)
	var cfg object
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		return "", fmt.Errorf("ConfigMap %s: %s: %w", configMapName, key, err)
	}
	if cfg == nil {
		cfg = object{}
	}
	edit(cfg)
	b, err := yaml.Marshal(cfg)
	return string(b), err
}
