package cable

import (
	"fmt"
	"unicode"
)

// MaxLinkName is the longest network link name the kernel takes (IFNAMSIZ - 1).
const MaxLinkName = 15

// CheckLinkName applies the kernel's dev_valid_name rules to a link name, or to the start of
// one when max is smaller than MaxLinkName. The error is a phrase that follows the name, e.g.
// `"a/b" has the invalid character '/'`, so it fits a SettingError's reason.
func CheckLinkName(name string, max int) error {
	switch {
	case name == "":
		return fmt.Errorf("is empty")
	case len(name) > max:
		return fmt.Errorf("is %d bytes, at most %d fit", len(name), max)
	case name == "." || name == "..":
		return fmt.Errorf("is not a link name (. and .. are reserved)")
	}
	for _, r := range name {
		if r == '/' || r == ':' || unicode.IsSpace(r) || r > unicode.MaxASCII || !unicode.IsPrint(r) {
			return fmt.Errorf("has the invalid character %q", r)
		}
	}
	return nil
}
