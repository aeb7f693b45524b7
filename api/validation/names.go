// Package validation is the one place that says what a valid cluster name, node name, CIDR and
// label is, for the agent config, the broker and cablectl alike, so that what one side accepts
// the others never refuse. It is pure: no I/O, table-tested and fuzzed.
package validation

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	dnsLabelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelNameRE    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// ValidateClusterName checks that name is a DNS label (RFC 1123, at most 63 characters), as
// cluster names become parts of DNS names and interface names.
func ValidateClusterName(name string) error {
	return ValidateDNSLabel("cluster name", name)
}

// ValidateNodeName checks a node name: a DNS subdomain (as Kubernetes node names) of at most 253
// characters.
func ValidateNodeName(name string) error {
	if name == "" {
		return fmt.Errorf("node name is empty")
	}
	if len(name) > 253 {
		return fmt.Errorf("node name %q is %d characters long, at most 253 allowed", name, len(name))
	}
	if !dnsSubdomainRE.MatchString(name) {
		return fmt.Errorf("node name %q is not a DNS subdomain (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)", name)
	}
	return nil
}

// ValidateDNSLabel checks that v is an RFC 1123 DNS label of at most 63 characters; field names
// the value in the error (e.g. "namespace").
func ValidateDNSLabel(field, v string) error {
	if v == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(v) > 63 {
		return fmt.Errorf("%s %q is %d characters long, at most 63 allowed", field, v, len(v))
	}
	if !dnsLabelRE.MatchString(v) {
		return fmt.Errorf("%s %q is not a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)", field, v)
	}
	return nil
}

// NodeNameFromHost turns a host name into the node name an agent uses by default, as the kubelet
// does: lower-cased, and without a trailing dot. The result still has to pass ValidateNodeName (a
// host name with '_' does not, and the agent then asks for an explicit node name).
func NodeNameFromHost(host string) string {
	return strings.ToLower(strings.TrimSuffix(host, "."))
}
