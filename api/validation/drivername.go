package validation

import (
	"fmt"
	"strings"
)

// ValidateDriverName checks a cable driver's registry name as policies, endpoints and the agent
// config carry it: DNS labels joined by '+' (a combined cable names its parts: "vxlan+ipsec"),
// at most 63 characters in all. field names the value in the error.
func ValidateDriverName(field, name string) error {
	if name == "" {
		return fmt.Errorf("%s: driver name is empty", field)
	}
	if len(name) > 63 {
		return fmt.Errorf("%s: driver name %q is %d characters long, at most 63 allowed", field, name, len(name))
	}
	for _, part := range strings.Split(name, "+") {
		if !dnsLabelRE.MatchString(part) {
			return fmt.Errorf("%s: driver name %q is not DNS labels joined by '+' (lower-case letters, digits and '-', each part starting and ending with a letter or digit)", field, name)
		}
	}
	return nil
}
