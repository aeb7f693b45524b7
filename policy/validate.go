package policy

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldError is one problem with one field of a policy. Field is the path
// as written in YAML ("spec.cableDriver.name"); Line is the YAML line when
// the error comes from DecodeYAML, else 0.
type FieldError struct {
	Field  string
	Detail string
	Line   int
}

func (e *FieldError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.Line, e.Field, e.Detail)
	}
	return e.Field + ": " + e.Detail
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

func joinErrs(errs []error) error {
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return errors.Join(out...)
}

var topologies = []string{TopologyFullMesh, TopologyPointToPoint, TopologyClientServer}

// Validate checks p and returns every problem found (errors.Join of
// *FieldError), or nil. It changes nothing.
func (p *ClusterConnectionPolicy) Validate() error {
	var errs []error
	switch p.APIVersion {
	case "", "v1", APIVersion:
	default:
		errs = append(errs, fieldErr("apiVersion", "%q is not one of %s, v1", p.APIVersion, APIVersion))
	}
	switch p.Kind {
	case "", Kind, KindSeed:
	default:
		errs = append(errs, fieldErr("kind", "%q is not %s", p.Kind, Kind))
	}
	if p.Metadata.Name == "" {
		errs = append(errs, fieldErr("metadata.name", "required"))
	} else {
		for _, msg := range validation.IsDNS1123Label(p.Metadata.Name) {
			errs = append(errs, fieldErr("metadata.name", "%q is not a DNS label: %s", p.Metadata.Name, msg))
		}
	}
	for _, k := range sortedKeys(p.Metadata.Labels) {
		errs = append(errs, validateLabelKey("metadata.labels."+k, k)...)
		errs = append(errs, validateLabelValue("metadata.labels."+k, p.Metadata.Labels[k])...)
	}
	if p.Origin != "" && p.Origin != OriginMesh {
		for _, msg := range validation.IsDNS1123Label(p.Origin) {
			errs = append(errs, fieldErr("origin", "%q is neither %q nor a cluster name: %s", p.Origin, OriginMesh, msg))
		}
	}
	errs = append(errs, p.Spec.validate())
	return joinErrs(errs)
}

func (s *Spec) validate() error {
	var errs []error
	errs = append(errs,
		s.LeftClusterSelector.Validate("spec.leftClusterSelector"),
		s.RightClusterSelector.Validate("spec.rightClusterSelector"),
		s.ClusterSelector.Validate("spec.clusterSelector"))
	if s.ClusterSelector != nil && s.UsesLeftRight() {
		errs = append(errs, fieldErr("spec.clusterSelector", "cannot be used together with spec.leftClusterSelector or spec.rightClusterSelector"))
	}
	switch s.Topology {
	case "", TopologyFullMesh, TopologyPointToPoint:
	case TopologyClientServer:
		if !s.UsesLeftRight() {
			errs = append(errs, fieldErr("spec.topology", "%q needs spec.leftClusterSelector (the servers) and spec.rightClusterSelector (the clients)", s.Topology))
		}
	default:
		errs = append(errs, fieldErr("spec.topology", "%q is not one of %s", s.Topology, strings.Join(topologies, ", ")))
	}
	switch s.ConnectionPolicy {
	case "", Connect:
		if d := s.CableDriver; d != nil {
			if d.Name == "" {
				errs = append(errs, fieldErr("spec.cableDriver.name", "required when spec.cableDriver is given (leave spec.cableDriver out to use the mesh default driver)"))
			} else {
				errs = append(errs, validateDriverName("spec.cableDriver.name", d.Name))
			}
			for _, k := range sortedKeys(d.Options) {
				errs = append(errs, validateOptionKey("spec.cableDriver.options", k))
			}
			errs = append(errs, validateMode("spec.cableDriver.options", d.Options))
		}
	case NoConnect:
		if s.CableDriver != nil {
			errs = append(errs, fieldErr("spec.cableDriver", "%q: a no-connect policy takes no cable driver", s.CableDriver.Name))
		}
	default:
		errs = append(errs, fieldErr("spec.connectionPolicy", "%q is not one of %s, %s", s.ConnectionPolicy, Connect, NoConnect))
	}
	return joinErrs(errs)
}

// validateDriverName accepts the names a cable.Register would use: DNS labels joined by '+'
// (a combined cable, "vxlan+ipsec"), at most 63 characters. Whether a node has that driver is
// the agent's business, not ours.
func validateDriverName(field, name string) error {
	if len(name) > 63 {
		return fieldErr(field, "%q is not a valid driver name: %d characters, at most 63", name, len(name))
	}
	for _, part := range strings.Split(name, "+") {
		if msgs := validation.IsDNS1123Label(part); len(msgs) > 0 {
			return fieldErr(field, "%q is not a valid driver name: %s", name, msgs[0])
		}
	}
	return nil
}

func validateOptionKey(field, k string) error {
	if k == "" {
		return fieldErr(field, "empty option key")
	}
	if msgs := validation.IsConfigMapKey(k); len(msgs) > 0 {
		return fieldErr(field+"."+k, "option key %q: %s", k, msgs[0])
	}
	return nil
}
