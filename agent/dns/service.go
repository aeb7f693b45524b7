package dns

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Type is a service import's type, as in the MCS API's ServiceImport.spec.type.
type Type int

const (
	// ClusterSetIP services are reached through their clusterset VIPs: the service name
	// answers with the VIPs, never with endpoints.
	ClusterSetIP Type = iota
	// Headless services answer with the addresses of their ready endpoints in every cluster,
	// and each endpoint has its own name <hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local.
	Headless
)

func (t Type) String() string {
	switch t {
	case ClusterSetIP:
		return "ClusterSetIP"
	case Headless:
		return "Headless"
	}
	return fmt.Sprintf("Type(%d)", int(t))
}

// Service is one service import as the DNS server sees it. The agent maps its service
// imports to these; the DNS server keeps nothing else.
type Service struct {
	// Namespace and Name are DNS labels (RFC 1123: letters, digits and '-', at most 63
	// characters, neither starting nor ending with '-'); upper case is folded to lower case.
	Namespace, Name string
	Type            Type
	// VIPs are the clusterset IPs of a ClusterSetIP service, IPv4 and/or IPv6. Ignored for
	// Headless services. A ClusterSetIP service without VIPs (not yet allocated) exists in
	// DNS but has no address records.
	VIPs []netip.Addr
	// Ports are the service's ports. A named port gets SRV records
	// _<name>._<proto>.<svc>.<ns>.svc.clusterset.local; every port, named or not, is listed
	// by an SRV query for the service name itself.
	Ports []Port
	// Endpoints are the backends of a Headless service in every cluster. Only ready ones are
	// answered. Ignored for ClusterSetIP services.
	Endpoints []Endpoint
}

// Port is one service port.
type Port struct {
	// Name is empty for an unnamed port, otherwise a DNS label.
	Name string
	Port uint16
	// Protocol is TCP, UDP or SCTP (any case); empty means TCP, as in Kubernetes.
	Protocol string
}

// Endpoint is one backend address of a Headless service.
type Endpoint struct {
	// Cluster is the cluster id of the endpoint's cluster: in Cablemesh the cluster's name,
	// a DNS label.
	Cluster string
	// Hostname is the endpoint's hostname (a DNS label), or empty: the endpoint is then named
	// after its IP with '.' or ':' replaced by '-' (10-1-2-3, fd00--1), as CoreDNS does.
	Hostname string
	IP       netip.Addr
	Ready    bool
}

// ErrInvalidInput is wrapped by every error about a service, port or endpoint that the zone
// builder skipped.
var ErrInvalidInput = errors.New("invalid DNS input")

// inputError names the service, the field and the value that were skipped, and why.
type inputError struct {
	service string // "ns/name" as given (possibly invalid)
	field   string
	value   string
	reason  string
}

func (e *inputError) Error() string {
	return fmt.Sprintf("service %q: %s %q %s: skipped", e.service, e.field, e.value, e.reason)
}

func (e *inputError) Unwrap() error { return ErrInvalidInput }

const labelRule = "is not a DNS label (letters, digits and '-', 1 to 63 characters, not starting or ending with '-')"

// normLabel lower-cases s and reports whether it is an RFC 1123 label.
func normLabel(s string) (string, bool) {
	if len(s) == 0 || len(s) > 63 {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return "", false
		}
	}
	return strings.ToLower(s), true
}

// normProtocol maps a port protocol to its SRV label without the underscore.
func normProtocol(p string) (string, bool) {
	switch strings.ToUpper(p) {
	case "", "TCP":
		return "tcp", true
	case "UDP":
		return "udp", true
	case "SCTP":
		return "sctp", true
	}
	return "", false
}

// normAddr returns a plain address (IPv4-mapped IPv6 unmapped) or false when a is not one a
// DNS record can carry: invalid, unspecified, or with an IPv6 zone.
func normAddr(a netip.Addr) (netip.Addr, string, bool) {
	if !a.IsValid() {
		return a, "is not an IP address", false
	}
	if a.Zone() != "" {
		return a, "has an IPv6 zone", false
	}
	a = a.Unmap()
	if a.IsUnspecified() {
		return a, "is the unspecified address", false
	}
	return a, "", true
}

// ipLabel is the hostname CoreDNS gives an endpoint without one: its IP with '.' or ':'
// replaced by '-' (IPv6 in its compressed form, so "fd00::1" becomes "fd00--1").
func ipLabel(a netip.Addr) string {
	if a.Is4() {
		return strings.ReplaceAll(a.String(), ".", "-")
	}
	return strings.ReplaceAll(a.String(), ":", "-")
}
