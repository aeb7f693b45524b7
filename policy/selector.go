package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Selector is a Kubernetes label selector (it converts freely to and from
// metav1.LabelSelector) with the proposal's shorthands on input:
//
//   - a plain map of labels, `location: on-premise`, means matchLabels;
//   - a value written `!production` (a YAML local tag, or a string starting
//     with "!") means "not production": a NotIn requirement, which, as in
//     Kubernetes, also matches clusters without the label.
//
// On output a selector is always in the {matchLabels, matchExpressions} form.
// All requirements must hold (AND); an empty selector matches every cluster.
type Selector metav1.LabelSelector

// LabelSelector returns s as the apimachinery type (nil stays nil).
func (s *Selector) LabelSelector() *metav1.LabelSelector {
	return (*metav1.LabelSelector)(s)
}

// IsEmpty reports whether s has no requirement (and so matches everything).
func (s *Selector) IsEmpty() bool {
	return s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0)
}

// DeepCopy returns a copy of s sharing nothing with it.
func (s *Selector) DeepCopy() *Selector {
	if s == nil {
		return nil
	}
	c := &Selector{MatchLabels: maps.Clone(s.MatchLabels)}
	for _, r := range s.MatchExpressions {
		r.Values = slices.Clone(r.Values)
		c.MatchExpressions = append(c.MatchExpressions, r)
	}
	return c
}

// Matches reports whether labels satisfy every requirement of s. An invalid
// selector (see Validate) matches nothing.
func (s *Selector) Matches(labels map[string]string) bool {
	m, err := compileSelector(s)
	if err != nil {
		return false
	}
	return m.matches(labels)
}

// Validate checks keys, values and operators; errors name field (the path
// of the selector, e.g. "spec.leftClusterSelector").
func (s *Selector) Validate(field string) error {
	if s == nil {
		return nil
	}
	var errs []error
	for _, k := range sortedKeys(s.MatchLabels) {
		path := field + ".matchLabels." + k
		errs = append(errs, validateLabelKey(path, k)...)
		errs = append(errs, validateLabelValue(path, s.MatchLabels[k])...)
	}
	for i, r := range s.MatchExpressions {
		path := fmt.Sprintf("%s.matchExpressions[%d]", field, i)
		errs = append(errs, validateLabelKey(path+".key", r.Key)...)
		switch r.Operator {
		case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn:
			if len(r.Values) == 0 {
				errs = append(errs, fieldErr(path+".values", "operator %s needs at least one value", r.Operator))
			}
			for j, v := range r.Values {
				errs = append(errs, validateLabelValue(fmt.Sprintf("%s.values[%d]", path, j), v)...)
			}
		case metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist:
			if len(r.Values) != 0 {
				errs = append(errs, fieldErr(path+".values", "%q: operator %s takes no values", r.Values, r.Operator))
			}
		default:
			errs = append(errs, fieldErr(path+".operator", "%q is not one of In, NotIn, Exists, DoesNotExist", string(r.Operator)))
		}
	}
	return joinErrs(errs)
}

func validateLabelKey(field, k string) []error {
	var errs []error
	for _, msg := range validation.IsQualifiedName(k) {
		errs = append(errs, fieldErr(field, "label key %q: %s", k, msg))
	}
	return errs
}

func validateLabelValue(field, v string) []error {
	var errs []error
	for _, msg := range validation.IsValidLabelValue(v) {
		errs = append(errs, fieldErr(field, "label value %q: %s", v, msg))
	}
	return errs
}

// matcher is a compiled selector: the resolver evaluates it hundreds of
// thousands of times, so it avoids maps and allocations.
type matcher struct {
	reqs []requirement
}

type requirement struct {
	key    string
	op     metav1.LabelSelectorOperator
	values []string
}

func compileSelector(s *Selector) (matcher, error) {
	if s == nil {
		return matcher{}, nil
	}
	if err := s.Validate("selector"); err != nil {
		return matcher{}, err
	}
	var m matcher
	for _, k := range sortedKeys(s.MatchLabels) {
		m.reqs = append(m.reqs, requirement{key: k, op: metav1.LabelSelectorOpIn, values: []string{s.MatchLabels[k]}})
	}
	for _, r := range s.MatchExpressions {
		m.reqs = append(m.reqs, requirement{key: r.Key, op: r.Operator, values: r.Values})
	}
	return m, nil
}

func (m *matcher) matches(labels map[string]string) bool {
	for i := range m.reqs {
		r := &m.reqs[i]
		v, ok := labels[r.key]
		switch r.op {
		case metav1.LabelSelectorOpIn:
			if !ok || !slices.Contains(r.values, v) {
				return false
			}
		case metav1.LabelSelectorOpNotIn:
			if ok && slices.Contains(r.values, v) {
				return false
			}
		case metav1.LabelSelectorOpExists:
			if !ok {
				return false
			}
		case metav1.LabelSelectorOpDoesNotExist:
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// addLabel adds key=value from the shorthand or matchLabels forms: a value
// starting with "!" is the proposal's negation and becomes NotIn.
func (s *Selector) addLabel(key, value string) {
	if rest, ok := strings.CutPrefix(value, "!"); ok {
		s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: key, Operator: metav1.LabelSelectorOpNotIn, Values: []string{rest},
		})
		return
	}
	if s.MatchLabels == nil {
		s.MatchLabels = map[string]string{}
	}
	s.MatchLabels[key] = value
}

// selectorJSON is the canonical output form.
type selectorJSON struct {
	MatchLabels      map[string]string `json:"matchLabels,omitempty" yaml:"matchLabels,omitempty"`
	MatchExpressions []requirementJSON `json:"matchExpressions,omitempty" yaml:"matchExpressions,omitempty"`
}

type requirementJSON struct {
	Key      string   `json:"key" yaml:"key"`
	Operator string   `json:"operator" yaml:"operator"`
	Values   []string `json:"values,omitempty" yaml:"values,omitempty"`
}

func (s Selector) canonical() selectorJSON {
	out := selectorJSON{MatchLabels: s.MatchLabels}
	for _, r := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, requirementJSON{Key: r.Key, Operator: string(r.Operator), Values: r.Values})
	}
	return out
}

// MarshalJSON writes the canonical {matchLabels, matchExpressions} form.
func (s Selector) MarshalJSON() ([]byte, error) {
	return json.Marshal(s.canonical())
}

// MarshalYAML writes the canonical {matchLabels, matchExpressions} form.
func (s Selector) MarshalYAML() (any, error) {
	return s.canonical(), nil
}

// UnmarshalJSON accepts the canonical form (strictly: other keys are errors
// when matchLabels or matchExpressions is present) and the shorthand map of
// labels, where "!v" means NotIn v. JSON null leaves an empty selector.
func (s *Selector) UnmarshalJSON(data []byte) error {
	*s = Selector{}
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("selector: %w", err)
	}
	_, hasML := raw["matchLabels"]
	_, hasME := raw["matchExpressions"]
	if !hasML && !hasME {
		for _, k := range sortedKeys(raw) {
			var v string
			if err := json.Unmarshal(raw[k], &v); err != nil {
				return fmt.Errorf("selector label %q: value must be a string: %w", k, err)
			}
			s.addLabel(k, v)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c selectorJSON
	if err := dec.Decode(&c); err != nil {
		return fmt.Errorf("selector: %w", err)
	}
	for _, k := range sortedKeys(c.MatchLabels) {
		s.addLabel(k, c.MatchLabels[k])
	}
	for _, r := range c.MatchExpressions {
		s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: r.Key, Operator: metav1.LabelSelectorOperator(r.Operator), Values: r.Values,
		})
	}
	return nil
}

// String writes s in the CLI form ParseSelector reads:
// "k=v,k!=v,k in (a,b),k notin (a,b),k,!k". The empty selector is "".
// ParseSelector(s.String()) selects the same clusters as s.
func (s *Selector) String() string {
	if s == nil {
		return ""
	}
	var parts []string
	for _, k := range sortedKeys(s.MatchLabels) {
		parts = append(parts, k+"="+s.MatchLabels[k])
	}
	for _, r := range s.MatchExpressions {
		switch r.Operator {
		case metav1.LabelSelectorOpIn:
			if len(r.Values) == 1 && r.Values[0] == "" {
				// "k in ()" would read as the empty set; "k=" means the same as In [""].
				parts = append(parts, r.Key+"=")
				continue
			}
			parts = append(parts, r.Key+" in ("+strings.Join(r.Values, ",")+")")
		case metav1.LabelSelectorOpNotIn:
			if len(r.Values) == 1 {
				parts = append(parts, r.Key+"!="+r.Values[0])
			} else {
				parts = append(parts, r.Key+" notin ("+strings.Join(r.Values, ",")+")")
			}
		case metav1.LabelSelectorOpExists:
			parts = append(parts, r.Key)
		case metav1.LabelSelectorOpDoesNotExist:
			parts = append(parts, "!"+r.Key)
		default:
			parts = append(parts, fmt.Sprintf("%s %s (%s)", r.Key, r.Operator, strings.Join(r.Values, ",")))
		}
	}
	return strings.Join(parts, ",")
}

// ParseSelector reads the CLI form of a selector (cablectl's
// --left-cluster-selector and friends), terms separated by commas, all of
// which must hold:
//
//	key=value  key==value   label equals value (matchLabels)
//	key!=value key=!value   label is not value, or absent (NotIn)
//	key in (a,b)            label is one of a, b (In)
//	key notin (a,b)         label is none of a, b, or absent (NotIn)
//	key                     label present (Exists)
//	!key                    label absent (DoesNotExist)
//
// The empty string is the empty selector, which matches every cluster. The
// result is validated; errors quote the offending term.
func ParseSelector(s string) (*Selector, error) {
	sel := &Selector{}
	terms, err := splitTerms(s)
	if err != nil {
		return nil, err
	}
	for _, term := range terms {
		if err := sel.parseTerm(term); err != nil {
			return nil, err
		}
	}
	if err := sel.Validate("selector"); err != nil {
		return nil, fmt.Errorf("selector %q: %w", s, err)
	}
	return sel, nil
}

// splitTerms splits on commas outside parentheses.
func splitTerms(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var terms []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
			if depth > 1 {
				return nil, fmt.Errorf("selector %q: nested parenthesis at offset %d", s, i)
			}
		case ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("selector %q: unbalanced ')' at offset %d", s, i)
			}
		case ',':
			if depth == 0 {
				terms = append(terms, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("selector %q: missing ')'", s)
	}
	terms = append(terms, strings.TrimSpace(s[start:]))
	for _, t := range terms {
		if t == "" {
			return nil, fmt.Errorf("selector %q: empty term", s)
		}
	}
	return terms, nil
}

func (s *Selector) parseTerm(term string) error {
	add := func(key string, op metav1.LabelSelectorOperator, values ...string) {
		s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: values})
	}
	// Set-based: "key in (a,b)" / "key notin (a,b)".
	if open := strings.IndexByte(term, '('); open >= 0 {
		if !strings.HasSuffix(term, ")") {
			return fmt.Errorf("selector term %q: text after ')'", term)
		}
		head := strings.Fields(term[:open])
		if len(head) != 2 {
			return fmt.Errorf("selector term %q: want \"key in (a,b)\" or \"key notin (a,b)\"", term)
		}
		var op metav1.LabelSelectorOperator
		switch head[1] {
		case "in":
			op = metav1.LabelSelectorOpIn
		case "notin":
			op = metav1.LabelSelectorOpNotIn
		default:
			return fmt.Errorf("selector term %q: operator %q is not in or notin", term, head[1])
		}
		inner := strings.TrimSpace(term[open+1 : len(term)-1])
		if inner == "" {
			return fmt.Errorf("selector term %q: empty value list", term)
		}
		var values []string
		for v := range strings.SplitSeq(inner, ",") {
			values = append(values, strings.TrimSpace(v))
		}
		add(head[0], op, values...)
		return nil
	}
	if strings.ContainsRune(term, ')') {
		return fmt.Errorf("selector term %q: unbalanced ')'", term)
	}
	if i := strings.Index(term, "!="); i >= 0 {
		add(strings.TrimSpace(term[:i]), metav1.LabelSelectorOpNotIn, strings.TrimSpace(term[i+2:]))
		return nil
	}
	if i := strings.IndexByte(term, '='); i >= 0 {
		key := strings.TrimSpace(term[:i])
		value := strings.TrimPrefix(term[i+1:], "=") // "==" is the same as "="
		value = strings.TrimSpace(value)
		if strings.HasPrefix(value, "!") {
			s.addLabel(key, value)
			return nil
		}
		if old, dup := s.MatchLabels[key]; dup {
			return fmt.Errorf("selector term %q: key %q already required to be %q", term, key, old)
		}
		s.addLabel(key, value)
		return nil
	}
	if rest, ok := strings.CutPrefix(term, "!"); ok {
		add(strings.TrimSpace(rest), metav1.LabelSelectorOpDoesNotExist)
		return nil
	}
	if strings.ContainsAny(term, " \t") {
		return fmt.Errorf("selector term %q: want key=value, key!=value, key in (..), key notin (..), key or !key", term)
	}
	add(term, metav1.LabelSelectorOpExists)
	return nil
}

// ParseOptions reads "k=v,k=v" (cablectl's --cable-config) into a map.
// Keys must be non-empty and unique; values may be empty.
func ParseOptions(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for term := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(term, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("option %q: want key=value", term)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("option %q: key %q given twice", term, k)
		}
		if err := validateOptionKey("options", k); err != nil {
			return nil, err
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func toRequirement(r requirementJSON) metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: r.Key, Operator: metav1.LabelSelectorOperator(r.Operator), Values: r.Values}
}
