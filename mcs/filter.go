package mcs

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// ParseImportSelector parses an import selector (Kubernetes label selector syntax, e.g.
// "cablemesh.io/exported=true,env!=dev"). Unlike a Kubernetes selector, an empty one selects
// nothing: a cluster that sets imports.selector to "" imports no service (the importing
// side chooses, and choosing nothing is a choice).
func ParseImportSelector(s string) (labels.Selector, error) {
	if s == "" {
		return labels.Nothing(), nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("import selector %q: %w", s, err)
	}
	return sel, nil
}

// Visible returns what of imp an agent of cluster self may use: the clusters that are self or
// that connected says its policies connect it to, and whose export labels sel admits; the import's
// ports are the union of those clusters' ports. It returns nil when no cluster is left.
// Conflicts stay as they are, for the operator to see.
func Visible(imp *apiv1.ServiceImport, self string, connected func(cluster string) bool, sel labels.Selector) *apiv1.ServiceImport {
	var kept []*apiv1.ImportedCluster
	for _, c := range imp.GetClusters() {
		if c.GetCluster() != self && !connected(c.GetCluster()) {
			continue
		}
		if !sel.Matches(labels.Set(c.GetLabels())) {
			continue
		}
		kept = append(kept, c)
	}
	if len(kept) == 0 {
		return nil
	}
	out := &apiv1.ServiceImport{
		Namespace: imp.GetNamespace(),
		Name:      imp.GetName(),
		Type:      imp.GetType(),
		Vips:      slices.Clone(imp.GetVips()),
		Clusters:  kept,
		Conflicts: imp.GetConflicts(),
	}
	var ports []*apiv1.ServicePort
	for _, c := range kept {
		ports, _ = unionPorts(ports, c.GetPorts()) // kept clusters were accepted by Merge: no conflict
	}
	out.Ports = ports
	return out
}

// LabelsOf returns the labels of cluster's export in imp (nil when it exports none).
func LabelsOf(imp *apiv1.ServiceImport, cluster string) map[string]string {
	for _, c := range imp.GetClusters() {
		if c.GetCluster() == cluster {
			return maps.Clone(c.GetLabels())
		}
	}
	return nil
}
