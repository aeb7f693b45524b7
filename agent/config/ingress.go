package config

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
)

// Ingress modes.
const (
	IngressKernel = "kernel"
	IngressEnvoy  = "envoy"
)

// Defaults of the ingress block.
const (
	DefaultIngressMode = IngressKernel
	// DefaultIngressPortRange is where the agent picks the ingress port of every exported service
	// port ("one inbound per service, port picked automatically").
	DefaultIngressPortRange = "15000-15999"
	// DefaultIngressSNIPort and DefaultIngressHTTPPort are the Envoy ingress's shared listeners,
	// outside the default range so that no service port can be allocated onto them.
	DefaultIngressSNIPort  = 16443
	DefaultIngressHTTPPort = 16080
	// DefaultMeshDomain ends the SNI names of the ingress's passthrough listener:
	// <svc>.<ns>.svc.<cluster>.<meshDomain>.
	DefaultMeshDomain = "cablemesh.local"
)

// Ingress configures the gateway's ingress: the port every exported service port is served on
// and the data plane that serves them.
type Ingress struct {
	// Mode is the data plane: kernel (nftables DNAT/SNAT, L4) or envoy (an Envoy beside the
	// agent, configured over xDS). Default: kernel.
	Mode string `yaml:"mode" json:"mode"`
	// PortRange is the range ingress ports are allocated from, "FIRST-LAST" (1024..65535).
	// Allocations persist in stateDir/ingress-ports.json. Default: 15000-15999.
	PortRange string `yaml:"portRange" json:"portRange"`
	// SNIPort is the Envoy TLS passthrough listener's port (one filter chain per exported
	// service, by SNI). Default: 16443.
	SNIPort int `yaml:"sniPort" json:"sniPort"`
	// HTTPPort is the Envoy HTTP listener's port (mTLS: callers present a mesh certificate;
	// virtual hosts <svc>.<ns>.svc.clusterset.local). Default: 16080.
	HTTPPort int `yaml:"httpPort" json:"httpPort"`
	// MeshDomain is the last part of the SNI names: <svc>.<ns>.svc.<cluster>.<meshDomain>.
	// Default: cablemesh.local.
	MeshDomain string `yaml:"meshDomain" json:"meshDomain"`
	// XDS is the agent's xDS server.
	XDS XDS `yaml:"xds" json:"xds"`
}

// XDS configures the agent's xDS server (agent/xds).
type XDS struct {
	// Listen is the unix socket the xDS server listens on: an absolute path, or "unix:PATH".
	// TCP is refused: the server hands out the ingress's private key and checks each client's
	// uid and gid (SO_PEERCRED), which only a unix socket can tell. Default: "" (no xDS server).
	Listen string `yaml:"listen" json:"listen,omitempty"`
	// AllowUID is a uid, besides root and the agent's own, whose processes may use the xDS
	// server (Envoy's user); the socket file is given to it. 0: none.
	AllowUID int64 `yaml:"allowUID" json:"allowUID,omitempty"`
	// AllowGID is a gid whose processes (by their effective gid) may use the xDS server; the
	// socket file is given to the group, mode 0660. 0: none.
	AllowGID int64 `yaml:"allowGID" json:"allowGID,omitempty"`
}

// maxID is the largest uid or gid: (uid_t)-1 means "no id" to the kernel.
const maxID = 1<<32 - 2

// applyIngressDefaults fills the ingress block's defaults.
func (c *Config) applyIngressDefaults() {
	if c.Ingress.Mode == "" {
		c.Ingress.Mode = DefaultIngressMode
	}
	if c.Ingress.PortRange == "" {
		c.Ingress.PortRange = DefaultIngressPortRange
	}
	if c.Ingress.SNIPort == 0 {
		c.Ingress.SNIPort = DefaultIngressSNIPort
	}
	if c.Ingress.HTTPPort == 0 {
		c.Ingress.HTTPPort = DefaultIngressHTTPPort
	}
	if c.Ingress.MeshDomain == "" {
		c.Ingress.MeshDomain = DefaultMeshDomain
	}
}

// validateIngress checks the ingress block.
func (c *Config) validateIngress() error {
	in := c.Ingress
	switch in.Mode {
	case IngressKernel, IngressEnvoy:
	default:
		return fmt.Errorf("ingress.mode: %q is not one of kernel, envoy", in.Mode)
	}
	first, last, err := ParsePortRange(in.PortRange)
	if err != nil {
		return fmt.Errorf("ingress.portRange: %q %v", in.PortRange, err)
	}
	for _, p := range []struct {
		field string
		port  int
	}{{"ingress.sniPort", in.SNIPort}, {"ingress.httpPort", in.HTTPPort}} {
		if p.port < 1 || p.port > 65535 {
			return fmt.Errorf("%s: %d is not a port (1..65535)", p.field, p.port)
		}
		if p.port >= int(first) && p.port <= int(last) {
			return fmt.Errorf("%s: %d lies inside ingress.portRange %s, where service ports are allocated", p.field, p.port, in.PortRange)
		}
	}
	if in.SNIPort == in.HTTPPort {
		return fmt.Errorf("ingress.httpPort: %d is also ingress.sniPort", in.HTTPPort)
	}
	if err := checkMeshDomain(in.MeshDomain); err != nil {
		return fmt.Errorf("ingress.meshDomain: %q %v", in.MeshDomain, err)
	}
	if in.XDS.Listen != "" {
		if _, _, err := ParseXDSListen(in.XDS.Listen); err != nil {
			return fmt.Errorf("ingress.xds.listen: %w", err)
		}
	}
	for _, id := range []struct {
		field string
		v     int64
	}{{"ingress.xds.allowUID", in.XDS.AllowUID}, {"ingress.xds.allowGID", in.XDS.AllowGID}} {
		if id.v < 0 || id.v > maxID {
			return fmt.Errorf("%s: %d is not a uid/gid (0..%d)", id.field, id.v, int64(maxID))
		}
		if id.v != 0 && in.XDS.Listen == "" {
			return fmt.Errorf("%s: %d is set, but ingress.xds.listen is not (there is no xDS server to allow it on)", id.field, id.v)
		}
	}
	return nil
}

// ParsePortRange parses "FIRST-LAST" (1024 <= FIRST <= LAST <= 65535).
func ParsePortRange(s string) (first, last uint16, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, errors.New("is not FIRST-LAST")
	}
	f, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	l, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if err1 != nil || err2 != nil {
		return 0, 0, errors.New("is not FIRST-LAST with two ports")
	}
	// Ports below 1024 are the host's well-known services; an ingress must not take them.
	if f < 1024 || l < f {
		return 0, 0, errors.New("is out of range (1024 <= FIRST <= LAST <= 65535)")
	}
	return uint16(f), uint16(l), nil
}

// checkMeshDomain accepts a DNS name of lower-case labels.
func checkMeshDomain(s string) error {
	if s == "" || len(s) > 200 {
		return errors.New("is not a DNS name of at most 200 characters")
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return errors.New("is not a DNS name (empty label, or one longer than 63 characters or with a '-' at an end)")
		}
		for _, r := range l {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
				return fmt.Errorf("is not a DNS name (%q is not a lower-case letter, digit or '-')", r)
			}
		}
	}
	return nil
}

// ParseXDSListen parses ingress.xds.listen: an absolute path or "unix:PATH", returned as the
// net.Listen network "unix" and the cleaned path. Everything else is refused, TCP above all (even
// loopback): the xDS server hands out the ingress's private key and admits a client by its uid
// and gid (SO_PEERCRED), which a TCP connection does not carry; on loopback TCP every local user,
// and every pod of a host-network node, could fetch it.
func ParseXDSListen(s string) (network, address string, err error) {
	p, ok := strings.CutPrefix(s, "unix:")
	if !ok && !strings.HasPrefix(s, "/") {
		if _, perr := netip.ParseAddrPort(s); perr == nil || strings.Contains(s, ":") {
			return "", "", fmt.Errorf("%q is a TCP address: the xDS server listens only on a unix socket, where it checks each client's uid and gid (root, the agent's user, ingress.xds.allowUID, ingress.xds.allowGID); use an absolute path such as /run/cablemesh/xds.sock", s)
		}
		return "", "", fmt.Errorf("%q is not a unix socket path (an absolute path, or unix:PATH)", s)
	}
	if !ok {
		p = s
	}
	if !filepath.IsAbs(p) {
		return "", "", fmt.Errorf("%q: a unix socket path must be absolute", s)
	}
	// sun_path holds 108 bytes including the terminating NUL.
	if len(p) > 107 {
		return "", "", fmt.Errorf("%q: longer than the 107 bytes a unix socket path may have", s)
	}
	if strings.ContainsRune(p, 0) {
		return "", "", fmt.Errorf("%q: a unix socket path may not contain NUL", s)
	}
	return "unix", filepath.Clean(p), nil
}
