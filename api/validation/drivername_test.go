package validation

import (
	"strings"
	"testing"
)

func TestDriverNamesAreDNSLabelsJoinedByPlus(t *testing.T) {
	for _, ok := range []string{"wireguard", "vxlan", "vxlan+ipsec", "a+b+c", "x1-y"} {
		if err := ValidateDriverName("drivers", ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "+", "vxlan+", "+ipsec", "vxlan++ipsec", "VXLAN", "vx_lan", "-vx", "vxlan ipsec", strings.Repeat("a", 64)} {
		err := ValidateDriverName("drivers", bad)
		if err == nil || !strings.HasPrefix(err.Error(), "drivers: driver name") {
			t.Errorf("%q: err = %v, want a refusal naming the field", bad, err)
		}
	}
}

func FuzzValidateDriverName(f *testing.F) {
	f.Add("vxlan+ipsec")
	f.Add("a++b")
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateDriverName("f", name) != nil {
			return
		}
		// Whatever passes fits a file name and a label value, part by part.
		if len(name) > 63 || strings.ContainsAny(name, "/ \x00") {
			t.Errorf("accepted %q", name)
		}
		for _, p := range strings.Split(name, "+") {
			if ValidateDNSLabel("part", p) != nil {
				t.Errorf("accepted %q with the part %q", name, p)
			}
		}
	})
}
