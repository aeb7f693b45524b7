package validation

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzParseCIDRs: whatever is accepted is canonical (re-parses to itself, no host bits) and free of
// overlaps; nothing panics.
func FuzzParseCIDRs(f *testing.F) {
	for _, s := range []string{"10.1.0.0/16", "10.1.0.0/16,10.2.0.0/16", "fd00::/64", "10.1.2.3/16", "::ffff:1.2.3.4/128", "1.2.3.4/33", "fe80::%eth0/64", ",,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ps, err := ParseCIDRs("pod CIDR", []string{in})
		if err != nil {
			return
		}
		for i, p := range ps {
			if p.Masked() != p {
				t.Fatalf("accepted %s with host bits", p)
			}
			q, err := netip.ParsePrefix(p.String())
			if err != nil || q != p {
				t.Fatalf("accepted %s does not round-trip: %v %v", p, q, err)
			}
			for _, o := range ps[i+1:] {
				if p.Overlaps(o) {
					t.Fatalf("accepted overlapping %s and %s", p, o)
				}
			}
		}
	})
}

// FuzzParseLabels: accepted labels pass validation on their own and re-parse to the same map.
func FuzzParseLabels(f *testing.F) {
	for _, s := range []string{"env=prod", "a=1,b=2", "cablemesh.io/site=x", "=", "a/b/c=d", "k=v=w", "a=1,a=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		m, err := ParseLabels(in)
		if err != nil {
			return
		}
		if err := ValidateLabels(m); err != nil {
			t.Fatalf("ParseLabels(%q) accepted labels that do not validate: %v", in, err)
		}
		var parts []string
		for k, v := range m {
			if strings.ContainsAny(k, ",=") || strings.ContainsAny(v, ",=") {
				t.Fatalf("accepted key or value with a separator: %q=%q", k, v)
			}
			parts = append(parts, k+"="+v)
		}
		again, err := ParseLabels(strings.Join(parts, ","))
		if err != nil || len(again) != len(m) {
			t.Fatalf("re-parse of %v: %v %v", m, again, err)
		}
	})
}

// FuzzParseLabelChanges: nothing panics, and a key is never both set and removed.
func FuzzParseLabelChanges(f *testing.F) {
	f.Add("env=prod", "old-")
	f.Add("a-", "a=1")
	f.Add("-", "=")
	f.Fuzz(func(t *testing.T, a, b string) {
		set, remove, err := ParseLabelChanges([]string{a, b})
		if err != nil {
			return
		}
		for _, k := range remove {
			if _, ok := set[k]; ok {
				t.Fatalf("key %q both set and removed", k)
			}
			if err := ValidateLabelKey(k); err != nil {
				t.Fatalf("removed key %q does not validate: %v", k, err)
			}
		}
	})
}

// FuzzNames: the name validators never panic and accept only what fits a DNS label/subdomain.
func FuzzNames(f *testing.F) {
	f.Add("east")
	f.Add("a.b-c")
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateClusterName(s) == nil && (len(s) > 63 || strings.ContainsAny(s, "._/ ")) {
			t.Fatalf("cluster name %q accepted", s)
		}
		if ValidateNodeName(s) == nil && (len(s) > 253 || strings.ContainsAny(s, "_/ ") || strings.ToLower(s) != s) {
			t.Fatalf("node name %q accepted", s)
		}
	})
}
