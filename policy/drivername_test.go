package policy

import (
	"strings"
	"testing"
)

// TestCombinedDriverNamesAreValid: a combined cable's name joins its parts with '+'
// ("vxlan+ipsec"); each part is still a DNS label.
func TestCombinedDriverNamesAreValid(t *testing.T) {
	for _, ok := range []string{"wireguard", "vxlan+ipsec"} {
		if err := validateDriverName("spec.cableDriver.name", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"vxlan+", "+ipsec", "vxlan++ipsec", "VXLAN+ipsec", strings.Repeat("a+", 32) + "a"} {
		if err := validateDriverName("spec.cableDriver.name", bad); err == nil || !strings.Contains(err.Error(), "spec.cableDriver.name") {
			t.Errorf("%q: err = %v, want a refusal naming the field", bad, err)
		}
	}
}
