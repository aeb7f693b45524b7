package validation

import (
	"fmt"
	"sort"
	"strings"
)

// ValidateLabelKey checks a label key with the Kubernetes rules: an optional DNS-subdomain prefix
// of at most 253 characters and a '/', then a name of at most 63 characters made of
// alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.
func ValidateLabelKey(k string) error {
	if k == "" {
		return fmt.Errorf("label key is empty")
	}
	name := k
	if i := strings.LastIndexByte(k, '/'); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if prefix == "" {
			return fmt.Errorf("label key %q has an empty prefix before '/'", k)
		}
		if len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix) {
			return fmt.Errorf("label key %q: prefix %q is not a DNS subdomain of at most 253 characters", k, prefix)
		}
	}
	if name == "" {
		return fmt.Errorf("label key %q has an empty name", k)
	}
	if len(name) > 63 {
		return fmt.Errorf("label key %q: name is %d characters long, at most 63 allowed", k, len(name))
	}
	if !labelNameRE.MatchString(name) {
		return fmt.Errorf("label key %q: name %q must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", k, name)
	}
	return nil
}

// ValidateLabelValue checks a label value with the Kubernetes rules: empty, or at most 63
// characters of alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.
func ValidateLabelValue(k, v string) error {
	if v == "" {
		return nil
	}
	if len(v) > 63 {
		return fmt.Errorf("label %q: value %q is %d characters long, at most 63 allowed", k, v, len(v))
	}
	if !labelNameRE.MatchString(v) {
		return fmt.Errorf("label %q: value %q must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", k, v)
	}
	return nil
}

// ValidateLabels checks every key and value, in key order so the first error is deterministic.
func ValidateLabels(labels map[string]string) error {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := ValidateLabelKey(k); err != nil {
			return err
		}
		if err := ValidateLabelValue(k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// ParseLabels parses "k=v,k2=v2" (as --labels takes it) into a map and validates it. Values
// given several times may repeat a key only with the same value.
func ParseLabels(values ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		for _, kv := range strings.Split(v, ",") {
			kv = strings.TrimSpace(kv)
			if kv == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("label %q is not key=value", kv)
			}
			if old, dup := out[k]; dup && old != val {
				return nil, fmt.Errorf("label %q given twice with different values (%q, %q)", k, old, val)
			}
			out[k] = val
		}
	}
	if err := ValidateLabels(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ParseLabelChanges parses the arguments of `cluster label NAME k=v k2-`: "k=v" sets, "k-"
// removes. A key may not be both set and removed.
func ParseLabelChanges(args []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	removed := map[string]bool{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			if err := ValidateLabelKey(k); err != nil {
				return nil, nil, err
			}
			if err := ValidateLabelValue(k, v); err != nil {
				return nil, nil, err
			}
			if removed[k] {
				return nil, nil, fmt.Errorf("label %q is both set and removed", k)
			}
			set[k] = v
			continue
		}
		if k, ok := strings.CutSuffix(a, "-"); ok {
			if err := ValidateLabelKey(k); err != nil {
				return nil, nil, err
			}
			if _, isSet := set[k]; isSet {
				return nil, nil, fmt.Errorf("label %q is both set and removed", k)
			}
			if !removed[k] {
				removed[k] = true
				remove = append(remove, k)
			}
			continue
		}
		return nil, nil, fmt.Errorf("label change %q is neither key=value nor key-", a)
	}
	return set, remove, nil
}
