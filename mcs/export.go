package mcs

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
)

// Service types (MCS ServiceImport spec.type).
const (
	TypeClusterSetIP = "ClusterSetIP"
	TypeHeadless     = "Headless"
)

// Affinity of an export: which backends a caller in a cluster that also exports the service uses.
const (
	// AffinityLocal: ready backends of the caller's own cluster while there is one, else the
	// other clusters' (Cilium's service.cilium.io/affinity: local).
	AffinityLocal = "local"
	// AffinityNone: every ready backend of every cluster alike.
	AffinityNone = "none"
)

// LabelExported is set to "true" on every export that does not set it itself, so that the default
// import selector admits every export (as Linkerd's multicluster.linkerd.io/exported does).
const LabelExported = "cablemesh.io/exported"

// DefaultImportSelector is the agent's default imports.selector.
const DefaultImportSelector = LabelExported + "=true"

// Bounds on one export, so that one service cannot grow a watch message without limit.
const (
	MaxPorts     = 64
	MaxEndpoints = 4096
	MaxLabels    = 64
)

var protocols = []string{"TCP", "UDP", "SCTP"}

// portNameRE is an IANA service name as Kubernetes port names are (RFC 6335): at most 15
// characters of lower-case letters, digits and '-', at least one letter, no leading, trailing or
// double '-'.
var portNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// Normalize validates one export and fills its defaults in place: type ClusterSetIP, affinity
// local, protocol in upper case, and the label cablemesh.io/exported=true unless the export sets
// that label. field prefixes errors (e.g. "exports[2]"); every error names the field and the
// value. Endpoints are sorted by IP so that equal exports compare equal.
func Normalize(field string, e *apiv1.ServiceExport) error {
	if e == nil {
		return fmt.Errorf("%s: is empty", field)
	}
	if err := validation.ValidateDNSLabel("name", e.Name); err != nil {
		return fmt.Errorf("%s.name: %w", field, err)
	}
	if err := validation.ValidateDNSLabel("namespace", e.Namespace); err != nil {
		return fmt.Errorf("%s.namespace: %w", field, err)
	}
	switch e.Type {
	case "":
		e.Type = TypeClusterSetIP
	case TypeClusterSetIP, TypeHeadless:
	default:
		return fmt.Errorf("%s.type: %q is not %s or %s", field, e.Type, TypeClusterSetIP, TypeHeadless)
	}
	switch e.Affinity {
	case "":
		e.Affinity = AffinityLocal
	case AffinityLocal, AffinityNone:
	default:
		return fmt.Errorf("%s.affinity: %q is not %s or %s", field, e.Affinity, AffinityLocal, AffinityNone)
	}
	if len(e.Labels) > MaxLabels {
		return fmt.Errorf("%s.labels: %d labels, at most %d", field, len(e.Labels), MaxLabels)
	}
	if err := validation.ValidateLabels(e.Labels); err != nil {
		return fmt.Errorf("%s.labels: %w", field, err)
	}
	if _, set := e.Labels[LabelExported]; !set {
		if e.Labels == nil {
			e.Labels = map[string]string{}
		}
		e.Labels[LabelExported] = "true"
	}
	if err := normalizePorts(field, e); err != nil {
		return err
	}
	return normalizeEndpoints(field, e)
}

func normalizePorts(field string, e *apiv1.ServiceExport) error {
	if len(e.Ports) == 0 && e.Type == TypeClusterSetIP {
		return fmt.Errorf("%s.ports: a %s service needs at least one port", field, TypeClusterSetIP)
	}
	if len(e.Ports) > MaxPorts {
		return fmt.Errorf("%s.ports: %d ports, at most %d", field, len(e.Ports), MaxPorts)
	}
	names := map[string]bool{}
	type pp struct {
		port  uint32
		proto string
	}
	seen := map[pp]bool{}
	for i, p := range e.Ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		if p == nil {
			return fmt.Errorf("%s: is empty", f)
		}
		if p.Name == "" && len(e.Ports) > 1 {
			return fmt.Errorf("%s.name: is required when a service has several ports", f)
		}
		if p.Name != "" {
			if !portNameRE.MatchString(p.Name) || strings.Contains(p.Name, "--") || !strings.ContainsAny(p.Name, "abcdefghijklmnopqrstuvwxyz") {
				return fmt.Errorf("%s.name: %q is not a port name (an IANA service name: at most 15 lower-case letters, digits and '-', with a letter)", f, p.Name)
			}
			if names[p.Name] {
				return fmt.Errorf("%s.name: %q is used twice", f, p.Name)
			}
			names[p.Name] = true
		}
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("%s.port: %d is not a port (1..65535)", f, p.Port)
		}
		p.Protocol = strings.ToUpper(p.Protocol)
		if p.Protocol == "" {
			p.Protocol = "TCP"
		}
		if !slices.Contains(protocols, p.Protocol) {
			return fmt.Errorf("%s.protocol: %q is not TCP, UDP or SCTP", f, p.Protocol)
		}
		if seen[pp{p.Port, p.Protocol}] {
			return fmt.Errorf("%s: %d/%s is listed twice", f, p.Port, p.Protocol)
		}
		seen[pp{p.Port, p.Protocol}] = true
		if p.IngressPort > 65535 {
			return fmt.Errorf("%s.ingressPort: %d is not a port (0 for none, 1..65535)", f, p.IngressPort)
		}
		if p.TargetPort > 65535 {
			return fmt.Errorf("%s.targetPort: %d is not a port (0 for the same as port, 1..65535)", f, p.TargetPort)
		}
		if p.TargetPort == p.Port {
			p.TargetPort = 0 // one spelling of "the same port", so equal exports compare equal
		}
	}
	return nil
}

func normalizeEndpoints(field string, e *apiv1.ServiceExport) error {
	if len(e.Endpoints) > MaxEndpoints {
		return fmt.Errorf("%s.endpoints: %d endpoints, at most %d", field, len(e.Endpoints), MaxEndpoints)
	}
	seen := map[netip.Addr]bool{}
	for i, ep := range e.Endpoints {
		f := fmt.Sprintf("%s.endpoints[%d]", field, i)
		if ep == nil {
			return fmt.Errorf("%s: is empty", f)
		}
		a, err := netip.ParseAddr(ep.Ip)
		if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("%s.ip: %q is not a unicast IP address", f, ep.Ip)
		}
		a = a.Unmap()
		if seen[a] {
			return fmt.Errorf("%s.ip: %s is listed twice", f, a)
		}
		seen[a] = true
		ep.Ip = a.String()
		if ep.Hostname != "" {
			if err := validation.ValidateDNSLabel("hostname", ep.Hostname); err != nil {
				return fmt.Errorf("%s.hostname: %w", f, err)
			}
		}
	}
	slices.SortFunc(e.Endpoints, func(a, b *apiv1.ServiceEndpoint) int {
		return netip.MustParseAddr(a.Ip).Compare(netip.MustParseAddr(b.Ip))
	})
	return nil
}

// BackendPort is the port a backend of this service port listens on: its target port, else the
// port itself.
func BackendPort(p *apiv1.ServicePort) uint16 {
	if t := p.GetTargetPort(); t != 0 {
		return uint16(t)
	}
	return uint16(p.GetPort())
}

// Key is the namespace/name a service is known by in the clusterset.
func Key(namespace, name string) string { return namespace + "/" + name }

// ExportKey is the store key of one node's export.
func ExportKey(cluster, node, namespace, name string) string {
	return cluster + "/" + node + "/" + namespace + "/" + name
}
