package cablectl

import "strings"

// isCobraUsageError recognises the errors cobra itself returns for bad invocations (unknown
// command, wrong number of arguments) which it does not type.
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, s := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires exactly", "invalid argument"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
