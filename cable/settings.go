package cable

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// SettingError is a bad entry in a driver's settings (its block of the agent config). Every
// driver reports one in the same form, which is what the operator reads:
//
//	<driver>.<key>: <value> <reason>
//
// with the value as the operator wrote it: bare when it is a number, quoted when it is text
// (see FormatValue). An error about a key's presence rather than its value leaves the value out.
type SettingError struct {
	Driver string
	Key    string
	Value  string
	// Reason says what is wrong with the value, e.g. "is not a UDP port (1..65535)".
	Reason string
	// NoValue leaves the value out: the key itself is wrong where it stands.
	NoValue bool
}

func (e *SettingError) Error() string {
	if e.NoValue {
		return fmt.Sprintf("%s.%s: %s", e.Driver, e.Key, e.Reason)
	}
	return fmt.Sprintf("%s.%s: %s %s", e.Driver, e.Key, FormatValue(e.Value), e.Reason)
}

// BadSetting is a SettingError for the value v of driver.key; reason is a format for its
// arguments.
func BadSetting(driver, key, v, reason string, args ...any) error {
	return &SettingError{Driver: driver, Key: key, Value: v, Reason: fmt.Sprintf(reason, args...)}
}

// FormatValue prints a setting's value as the operator wrote it: a decimal integer bare, anything
// else quoted.
func FormatValue(v string) string {
	if _, ok := decimal(v); ok {
		return v
	}
	return strconv.Quote(v)
}

// UnknownSetting is the error for a key the driver does not take; it lists the known ones.
func UnknownSetting(driver, key, v string, known ...string) error {
	known = append([]string(nil), known...)
	sort.Strings(known)
	return BadSetting(driver, key, v, "is refused: unknown field %q (known: %s)", key, strings.Join(known, ", "))
}

// SortedKeys are the keys of settings or options in order, so that with several bad entries the
// error is always about the same one.
func SortedKeys[M ~map[string]string](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// decimal parses a canonical decimal integer: no sign but '-', no leading zeros, no spaces.
func decimal(v string) (int, bool) {
	n, err := strconv.Atoi(v)
	return n, err == nil && strconv.Itoa(n) == v
}

// IntSetting reads driver.key = v as a decimal integer within lo..hi.
func IntSetting(driver, key, v string, lo, hi int) (int, error) {
	n, ok := decimal(v)
	if !ok {
		return 0, BadSetting(driver, key, v, "is not a decimal integer (%d..%d)", lo, hi)
	}
	if n < lo || n > hi {
		return 0, BadSetting(driver, key, v, "is out of range (%d..%d)", lo, hi)
	}
	return n, nil
}

// PortSetting reads driver.key = v as a UDP port, 1..65535. 0 is refused: an unset port is an
// absent key.
func PortSetting(driver, key, v string) (int, error) {
	n, ok := decimal(v)
	if !ok || n < 1 || n > 65535 {
		return 0, BadSetting(driver, key, v, "is not a UDP port (1..65535)")
	}
	return n, nil
}

// MTUSetting reads driver.key = v as an MTU: 0 for automatic (derived from the underlay at Init),
// or lo..hi.
func MTUSetting(driver, key, v string, lo, hi int) (int, error) {
	n, ok := decimal(v)
	if !ok || n != 0 && (n < lo || n > hi) {
		return 0, BadSetting(driver, key, v, "is out of range (0 for automatic, or %d..%d)", lo, hi)
	}
	return n, nil
}
