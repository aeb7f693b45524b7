package limits

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cablemesh/cablemesh/policy"
)

// TestPolicyBoundsNamesFieldAndLimit: a policy over each bound gets one line per problem, naming
// the field and the limit; a policy exactly at the bounds gets none.
func TestPolicyBoundsNamesFieldAndLimit(t *testing.T) {
	build := func(labels, requirements, values, options, optionBytes int) policy.ClusterConnectionPolicy {
		p := policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "p", Labels: map[string]string{}}}
		for i := range labels {
			p.Metadata.Labels[fmt.Sprint("l", i)] = "v"
		}
		sel := &policy.Selector{MatchLabels: map[string]string{}}
		for i := range requirements - 1 {
			sel.MatchLabels[fmt.Sprint("k", i)] = "v"
		}
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: make([]string, values)}}
		p.Spec.ClusterSelector = sel
		p.Spec.CableDriver = &policy.CableDriver{Name: "wireguard", Options: map[string]string{}}
		for i := range options - 1 {
			p.Spec.CableDriver.Options[fmt.Sprint("o", i)] = "v"
		}
		p.Spec.CableDriver.Options["big"] = strings.Repeat("x", optionBytes)
		return p
	}
	if got := PolicyBounds(build(MaxLabels, MaxSelectorRequirements, MaxSelectorValues, MaxDriverOptions, MaxOptionValueBytes)); len(got) != 0 {
		t.Errorf("a policy at the bounds: %q, want no problem", got)
	}
	got := PolicyBounds(build(MaxLabels+1, MaxSelectorRequirements+1, MaxSelectorValues+1, MaxDriverOptions+1, MaxOptionValueBytes+1))
	want := []string{
		fmt.Sprintf("metadata.labels: %d labels, at most %d", MaxLabels+1, MaxLabels),
		fmt.Sprintf("spec.clusterSelector: %d requirements (matchLabels and matchExpressions), at most %d", MaxSelectorRequirements+1, MaxSelectorRequirements),
		fmt.Sprintf("spec.clusterSelector.matchExpressions[0].values: %d values, at most %d", MaxSelectorValues+1, MaxSelectorValues),
		fmt.Sprintf("spec.cableDriver.options: %d options, at most %d", MaxDriverOptions+1, MaxDriverOptions),
		fmt.Sprintf("spec.cableDriver.options.big: the value is %d bytes, at most %d", MaxOptionValueBytes+1, MaxOptionValueBytes),
	}
	if !slices.Equal(got, want) {
		t.Errorf("a policy over every bound:\n got %q\nwant %q", got, want)
	}
}
