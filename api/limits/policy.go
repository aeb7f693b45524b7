package limits

import (
	"fmt"
	"maps"
	"slices"

	"github.com/cablemesh/cablemesh/policy"
)

// PolicyBounds lists, one line per problem naming the field and the limit, where p exceeds the
// API's bounds (limits.go). The broker refuses such a policy; cablectl checks it before sending.
func PolicyBounds(p policy.ClusterConnectionPolicy) []string {
	var out []string
	if n := len(p.Metadata.Labels); n > MaxLabels {
		out = append(out, fmt.Sprintf("metadata.labels: %d labels, at most %d", n, MaxLabels))
	}
	for _, sel := range []struct {
		field string
		s     *policy.Selector
	}{{"spec.leftClusterSelector", p.Spec.LeftClusterSelector}, {"spec.rightClusterSelector", p.Spec.RightClusterSelector}, {"spec.clusterSelector", p.Spec.ClusterSelector}} {
		if sel.s == nil {
			continue
		}
		if n := len(sel.s.MatchLabels) + len(sel.s.MatchExpressions); n > MaxSelectorRequirements {
			out = append(out, fmt.Sprintf("%s: %d requirements (matchLabels and matchExpressions), at most %d", sel.field, n, MaxSelectorRequirements))
		}
		for i, r := range sel.s.MatchExpressions {
			if n := len(r.Values); n > MaxSelectorValues {
				out = append(out, fmt.Sprintf("%s.matchExpressions[%d].values: %d values, at most %d", sel.field, i, n, MaxSelectorValues))
			}
		}
	}
	if d := p.Spec.CableDriver; d != nil {
		if n := len(d.Options); n > MaxDriverOptions {
			out = append(out, fmt.Sprintf("spec.cableDriver.options: %d options, at most %d", n, MaxDriverOptions))
		}
		for _, k := range slices.Sorted(maps.Keys(d.Options)) {
			if n := len(d.Options[k]); n > MaxOptionValueBytes {
				out = append(out, fmt.Sprintf("spec.cableDriver.options.%s: the value is %d bytes, at most %d", k, n, MaxOptionValueBytes))
			}
		}
	}
	return out
}
