// Package config is the cable-agent configuration file: strict YAML (unknown fields are errors),
// defaults applied after decoding, and validation whose errors name the field and the value.
//
// Every field below is documented with its default; docs/agent-config.md repeats them for
// operators and must be kept in step with this file.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Defaults. They are exported so the agent, its docs and its tests agree on one value.
const (
	DefaultStateDir          = "/var/lib/cablemesh"
	DefaultStatusSocket      = "/run/cablemesh/agent.sock"
	DefaultWireGuardIface    = "cbl-wg0"
	DefaultWireGuardPort     = 51820
	DefaultLeaseSeconds      = 30
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultResyncInterval    = 30 * time.Second
	DefaultLogLevel          = "info"
	DefaultVXLANPort         = 4789
	DefaultVXLANVNI          = 100
	DefaultIPsecPort         = 500
	DefaultIPsecNATTPort     = 4500
	DefaultIPsecCharon       = "/usr/lib/ipsec/charon"

	// Health probes, in the manner of Linkerd's gateway probes (3s x 3). They are the values of
	// agent/health's defaults, repeated here so the config package stays free of I/O imports.
	DefaultHealthCheckPeriod           = 3 * time.Second
	DefaultHealthCheckTimeout          = 2 * time.Second
	DefaultHealthCheckFailureThreshold = 3
	DefaultHealthCheckWindow           = 128
)

// DefaultCableDrivers are the drivers a gateway runs when cableDrivers is not set: all three.
func DefaultCableDrivers() []string { return []string{"wireguard", "vxlan", "ipsec"} }

// Config is the whole agent configuration file.
type Config struct {
	// Cluster is the name of the cluster this node belongs to: a DNS label (lower-case letters,
	// digits and '-', at most 63 characters). It must match the cluster the join token was
	// issued for. Required.
	Cluster string `yaml:"cluster" json:"cluster"`
	// Node is this node's name, unique inside its cluster (at most 253 characters of letters,
	// digits, '-', '.' and '_'). Default: the host name.
	Node string `yaml:"node" json:"node"`
	// Broker is the broker's gRPC address, host:port. Required.
	Broker string `yaml:"broker" json:"broker"`
	// JoinTokenFile is the file holding the join token printed by `cablectl cluster join-token`.
	// It is read only when StateDir has no agent certificate yet (first start). Default: none;
	// required on first start.
	JoinTokenFile string `yaml:"joinTokenFile" json:"joinTokenFile"`
	// StateDir holds the agent's key and certificate (agent.key, agent.crt, ca.crt), the last
	// broker state (broker-state.json) and the drivers' persistent files (wireguard/ keys).
	// Default: /var/lib/cablemesh.
	StateDir string `yaml:"stateDir" json:"stateDir"`
	// Gateway is true on the node that terminates the cluster's tunnels: it registers an
	// endpoint with the broker and runs the cable. Other nodes only route remote clusters'
	// CIDRs via their cluster's gateway. Default: false.
	Gateway bool `yaml:"gateway" json:"gateway"`
	// AdvertiseAddress is the IP address remote gateways reach this node at (published as the
	// endpoint's private IP). Required when gateway is true.
	AdvertiseAddress string `yaml:"advertiseAddress" json:"advertiseAddress"`
	// PodCIDRs are the pod CIDRs behind this node (Universal sites; on Kubernetes the cluster's
	// own). Default: none, i.e. the CIDRs the cluster was created with at the broker.
	PodCIDRs []string `yaml:"podCIDRs" json:"podCIDRs"`
	// ServiceCIDRs are the service CIDRs behind this node. Default: none, i.e. the cluster's
	// service CIDRs at the broker.
	ServiceCIDRs []string `yaml:"serviceCIDRs" json:"serviceCIDRs"`
	// StatusSocket is the unix socket the status API (GET /v1/status, read by
	// `cablectl status`) listens on. Default: /run/cablemesh/agent.sock.
	StatusSocket string `yaml:"statusSocket" json:"statusSocket"`
	// CableDrivers are the cable drivers this gateway runs and publishes in its endpoint; the
	// connection policies pick one per pair among them. Each must be a registered driver, at
	// most once. Default: [wireguard, vxlan, ipsec].
	CableDrivers []string `yaml:"cableDrivers" json:"cableDrivers"`
	// WireGuard configures the wireguard cable driver on gateway nodes.
	WireGuard WireGuard `yaml:"wireguard" json:"wireguard"`
	// VXLAN configures the vxlan cable driver on gateway nodes.
	VXLAN VXLAN `yaml:"vxlan" json:"vxlan"`
	// IPsec configures the ipsec cable driver (strongSwan charon) on gateway nodes.
	IPsec IPsec `yaml:"ipsec" json:"ipsec"`
	// LeaseSeconds is the endpoint lease the agent asks the broker for; the broker withdraws
	// the endpoint when no heartbeat arrived for that long. Default: 30.
	LeaseSeconds int `yaml:"leaseSeconds" json:"leaseSeconds"`
	// HeartbeatInterval is how often a gateway renews its endpoint lease, as a Go duration
	// ("10s"). Must be shorter than leaseSeconds. Default: 10s.
	HeartbeatInterval time.Duration `yaml:"heartbeatInterval" json:"heartbeatInterval"`
	// ResyncInterval is how often the agent reconciles the host against the last broker state
	// even without a change from the broker, repairing drift. Default: 30s.
	ResyncInterval time.Duration `yaml:"resyncInterval" json:"resyncInterval"`
	// MetricsAddress is the host:port Prometheus metrics are served on at /metrics.
	// Default: "" (no metrics listener).
	MetricsAddress string `yaml:"metricsAddress" json:"metricsAddress"`
	// LogLevel is debug, info, warn or error. Default: info.
	LogLevel string `yaml:"logLevel" json:"logLevel"`
	// HealthCheck configures the probes a gateway sends to every remote gateway through its
	// tunnel.
	HealthCheck HealthCheck `yaml:"healthCheck" json:"healthCheck"`
}

// HealthCheck configures the gateway-to-gateway probes: an ICMP echo every period from this
// node's health-check address (its address inside its pod CIDRs) to each remote endpoint's
// health_check_ip, through the tunnel. failureThreshold failures in a row put the connection in
// state error; one answer recovers it. A remote endpoint without a health_check_ip is not
// probed (its state comes from the device alone).
type HealthCheck struct {
	// Enabled turns probing on or off. Default: true.
	Enabled *bool `yaml:"enabled" json:"enabled"`
	// Period between two probes of one connection, a Go duration, 100ms..1h. Default: 3s.
	Period time.Duration `yaml:"period" json:"period"`
	// Timeout is how long a probe waits for its answer, at least 10ms and at most period.
	// Default: 2s.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// FailureThreshold is how many consecutive failed probes put a connection in error, 1..100.
	// Default: 3.
	FailureThreshold int `yaml:"failureThreshold" json:"failureThreshold"`
	// Window is how many of the latest RTT samples the statistics (min/avg/max, p50/p95/p99)
	// cover, 1..65536. Default: 128.
	Window int `yaml:"window" json:"window"`
}

// IsEnabled reports whether probing is on (the default when Enabled is unset).
func (h HealthCheck) IsEnabled() bool { return h.Enabled == nil || *h.Enabled }

// WireGuard is the wireguard driver's node settings.
type WireGuard struct {
	// Interface is the WireGuard link name (at most 15 characters). Two agents on one host need
	// different names. Default: cbl-wg0.
	Interface string `yaml:"interface" json:"interface"`
	// Port is the UDP port WireGuard listens on and the endpoint publishes. Default: 51820.
	Port int `yaml:"port" json:"port"`
	// MTU of the WireGuard link; 0 means automatic (the underlay MTU minus WireGuard's
	// overhead of 80 bytes, at least 1280). Otherwise 1280..65535. Default: 0.
	MTU int `yaml:"mtu" json:"mtu"`
}

// VXLAN is the vxlan driver's node settings.
type VXLAN struct {
	// Port is the UDP port VXLAN listens on and the endpoint publishes. Default: 4789.
	Port int `yaml:"port" json:"port"`
	// VNI is the VXLAN network identifier, 1..16777215; both ends of a pair must agree (keep it
	// equal mesh-wide, or set it per pair with the policy option vni). Default: 100.
	VNI int `yaml:"vni" json:"vni"`
	// MTU of the VXLAN links; 0 means automatic (underlay MTU minus 50). Otherwise 576..65535.
	// Default: 0.
	MTU int `yaml:"mtu" json:"mtu"`
}

// IPsec is the ipsec driver's node settings.
type IPsec struct {
	// Port is charon's IKE UDP port. Default: 500.
	Port int `yaml:"port" json:"port"`
	// NATTPort is charon's NAT-T UDP port (IKE after the switch, UDP-encapsulated ESP); it must
	// differ from port. Default: 4500.
	NATTPort int `yaml:"nattPort" json:"nattPort"`
	// MTU of the tunnel routes; 0 means automatic (from the underlay and the datapath).
	// Otherwise 1280..65535. Default: 0.
	MTU int `yaml:"mtu" json:"mtu"`
	// Charon is the absolute path of the charon binary the driver starts and supervises.
	// Default: /usr/lib/ipsec/charon.
	Charon string `yaml:"charon" json:"charon"`
	// UseSystemCharon is the absolute path of the VICI socket of a charon the host already runs
	// (e.g. /var/run/charon.vici); the driver then starts none, and port, nattPort and charon
	// must be left unset. Default: "" (the driver runs its own charon).
	UseSystemCharon string `yaml:"useSystemCharon" json:"useSystemCharon"`
}

// maxSize bounds the config file: anything larger is not a config file.
const maxSize = 1 << 20

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent config: %w", err)
	}
	if len(data) > maxSize {
		return nil, fmt.Errorf("agent config %s: %d bytes is too large for a config file (at most %d)", path, len(data), maxSize)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("agent config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes data strictly, applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	c, err := Decode(data)
	if err != nil {
		return nil, err
	}
	c.ApplyDefaults(hostname)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

var unknownFieldRE = regexp.MustCompile(`line (\d+): field (\S+) not found in type \S+`)

// Decode parses one YAML document strictly: unknown fields, a second document and an empty
// file are errors. It applies no defaults.
func Decode(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("config is empty")
		}
		return nil, rewriteYAMLError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("config holds more than one YAML document")
	}
	return &c, nil
}

// rewriteYAMLError turns yaml.v3's "line 3: field foo not found in type config.Config" into
// "line 3: unknown field \"foo\"", which is what an operator needs to read.
func rewriteYAMLError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("decode YAML: %w", err)
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, m := range te.Errors {
		if sm := unknownFieldRE.FindStringSubmatch(m); sm != nil {
			m = fmt.Sprintf("line %s: unknown field %q", sm[1], sm[2])
		}
		msgs = append(msgs, m)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// hostname is the default node name; a variable so tests can pin it.
var hostname = func() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

// ApplyDefaults fills every unset field with its documented default. host supplies the node
// name default.
func (c *Config) ApplyDefaults(host func() string) {
	if c.Node == "" && host != nil {
		c.Node = host()
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.StatusSocket == "" {
		c.StatusSocket = DefaultStatusSocket
	}
	if c.WireGuard.Interface == "" {
		c.WireGuard.Interface = DefaultWireGuardIface
	}
	if c.WireGuard.Port == 0 {
		c.WireGuard.Port = DefaultWireGuardPort
	}
	if c.CableDrivers == nil {
		c.CableDrivers = DefaultCableDrivers()
	}
	if c.VXLAN.Port == 0 {
		c.VXLAN.Port = DefaultVXLANPort
	}
	if c.VXLAN.VNI == 0 {
		c.VXLAN.VNI = DefaultVXLANVNI
	}
	// With a system charon the driver owns no ports and no binary: leave them unset, as the
	// driver requires.
	if c.IPsec.UseSystemCharon == "" {
		if c.IPsec.Port == 0 {
			c.IPsec.Port = DefaultIPsecPort
		}
		if c.IPsec.NATTPort == 0 {
			c.IPsec.NATTPort = DefaultIPsecNATTPort
		}
		if c.IPsec.Charon == "" {
			c.IPsec.Charon = DefaultIPsecCharon
		}
	}
	if c.LeaseSeconds == 0 {
		c.LeaseSeconds = DefaultLeaseSeconds
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if c.HealthCheck.Enabled == nil {
		on := true
		c.HealthCheck.Enabled = &on
	}
	if c.HealthCheck.Period == 0 {
		c.HealthCheck.Period = DefaultHealthCheckPeriod
	}
	if c.HealthCheck.Timeout == 0 {
		// A period set below the default timeout brings the timeout down with it, so that
		// `period: 1s` alone is a valid config.
		c.HealthCheck.Timeout = min(DefaultHealthCheckTimeout, c.HealthCheck.Period)
	}
	if c.HealthCheck.FailureThreshold == 0 {
		c.HealthCheck.FailureThreshold = DefaultHealthCheckFailureThreshold
	}
	if c.HealthCheck.Window == 0 {
		c.HealthCheck.Window = DefaultHealthCheckWindow
	}
}

var (
	dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	nodeRE     = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$`)
	ifaceRE    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
)

// Validate checks every field; the error names the first bad field and its value.
func (c *Config) Validate() error {
	if c.Cluster == "" {
		return errors.New("cluster: is required")
	}
	if !dnsLabelRE.MatchString(c.Cluster) {
		return fmt.Errorf("cluster: %q is not a DNS label (lower-case letters, digits and '-', at most 63 characters)", c.Cluster)
	}
	if c.Node == "" {
		return errors.New("node: is required (no host name to default to)")
	}
	if !nodeRE.MatchString(c.Node) {
		return fmt.Errorf("node: %q is not a valid node name (letters, digits, '-', '.', '_', at most 253 characters)", c.Node)
	}
	if c.Broker == "" {
		return errors.New("broker: is required (host:port of the broker)")
	}
	if err := checkHostPort(c.Broker); err != nil {
		return fmt.Errorf("broker: %q %v", c.Broker, err)
	}
	if c.Gateway {
		if c.AdvertiseAddress == "" {
			return errors.New("advertiseAddress: is required when gateway is true")
		}
	}
	if c.AdvertiseAddress != "" {
		a, err := netip.ParseAddr(c.AdvertiseAddress)
		if err != nil || a.Zone() != "" {
			return fmt.Errorf("advertiseAddress: %q is not an IP address", c.AdvertiseAddress)
		}
		if a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("advertiseAddress: %q cannot be reached by other gateways", c.AdvertiseAddress)
		}
	}
	if err := checkCIDRs("podCIDRs", c.PodCIDRs); err != nil {
		return err
	}
	if err := checkCIDRs("serviceCIDRs", c.ServiceCIDRs); err != nil {
		return err
	}
	if !strings.HasPrefix(c.StateDir, "/") {
		return fmt.Errorf("stateDir: %q is not an absolute path", c.StateDir)
	}
	if !strings.HasPrefix(c.StatusSocket, "/") {
		return fmt.Errorf("statusSocket: %q is not an absolute path", c.StatusSocket)
	}
	// sun_path holds 108 bytes including the terminating NUL.
	if len(c.StatusSocket) > 107 {
		return fmt.Errorf("statusSocket: %q is longer than the 107 bytes a unix socket path may have", c.StatusSocket)
	}
	if !ifaceRE.MatchString(c.WireGuard.Interface) || c.WireGuard.Interface == "." || c.WireGuard.Interface == ".." {
		return fmt.Errorf("wireguard.interface: %q is not a link name (at most 15 of letters, digits, '_', '.', '-')", c.WireGuard.Interface)
	}
	if c.WireGuard.Port < 1 || c.WireGuard.Port > 65535 {
		return fmt.Errorf("wireguard.port: %d is not a UDP port (1..65535)", c.WireGuard.Port)
	}
	if c.WireGuard.MTU != 0 && (c.WireGuard.MTU < 1280 || c.WireGuard.MTU > 65535) {
		return fmt.Errorf("wireguard.mtu: %d is out of range (0 for automatic, or 1280..65535)", c.WireGuard.MTU)
	}
	if err := c.validateDrivers(); err != nil {
		return err
	}
	if c.LeaseSeconds < 2 || c.LeaseSeconds > 3600 {
		return fmt.Errorf("leaseSeconds: %d is out of range (2..3600)", c.LeaseSeconds)
	}
	if c.HeartbeatInterval < 100*time.Millisecond {
		return fmt.Errorf("heartbeatInterval: %q is too short (at least 100ms)", c.HeartbeatInterval)
	}
	if c.HeartbeatInterval >= time.Duration(c.LeaseSeconds)*time.Second {
		return fmt.Errorf("heartbeatInterval: %q must be shorter than leaseSeconds (%ds), or the lease expires between heartbeats", c.HeartbeatInterval, c.LeaseSeconds)
	}
	if c.ResyncInterval < time.Second {
		return fmt.Errorf("resyncInterval: %q is too short (at least 1s)", c.ResyncInterval)
	}
	if c.MetricsAddress != "" {
		if err := checkHostPort(c.MetricsAddress); err != nil {
			return fmt.Errorf("metricsAddress: %q %v", c.MetricsAddress, err)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("logLevel: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	return c.HealthCheck.validate()
}

var driverNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

func (c *Config) validateDrivers() error {
	if len(c.CableDrivers) == 0 {
		return errors.New("cableDrivers: is empty (list at least one driver, or leave it unset for [wireguard, vxlan, ipsec])")
	}
	seen := map[string]bool{}
	for i, d := range c.CableDrivers {
		if !driverNameRE.MatchString(d) {
			return fmt.Errorf("cableDrivers[%d]: %q is not a driver name", i, d)
		}
		if seen[d] {
			return fmt.Errorf("cableDrivers[%d]: %q is listed twice", i, d)
		}
		seen[d] = true
	}
	v := c.VXLAN
	if v.Port < 1 || v.Port > 65535 {
		return fmt.Errorf("vxlan.port: %d is not a UDP port (1..65535)", v.Port)
	}
	if v.VNI < 1 || v.VNI > 1<<24-1 {
		return fmt.Errorf("vxlan.vni: %d is out of range (1..16777215)", v.VNI)
	}
	if v.MTU != 0 && (v.MTU < 576 || v.MTU > 65535) {
		return fmt.Errorf("vxlan.mtu: %d is out of range (0 for automatic, or 576..65535)", v.MTU)
	}
	p := c.IPsec
	if p.UseSystemCharon != "" {
		if !strings.HasPrefix(p.UseSystemCharon, "/") {
			return fmt.Errorf("ipsec.useSystemCharon: %q is not an absolute path (the system charon's VICI socket)", p.UseSystemCharon)
		}
		for _, f := range []struct {
			name string
			set  bool
		}{{"port", p.Port != 0}, {"nattPort", p.NATTPort != 0}, {"charon", p.Charon != ""}} {
			if f.set {
				return fmt.Errorf("ipsec.%s: must be unset with ipsec.useSystemCharon %q (the system charon has its own)", f.name, p.UseSystemCharon)
			}
		}
	} else {
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("ipsec.port: %d is not a UDP port (1..65535)", p.Port)
		}
		if p.NATTPort < 1 || p.NATTPort > 65535 {
			return fmt.Errorf("ipsec.nattPort: %d is not a UDP port (1..65535)", p.NATTPort)
		}
		if p.Port == p.NATTPort {
			return fmt.Errorf("ipsec.nattPort: %d equals ipsec.port; charon needs two different ports", p.NATTPort)
		}
		if !strings.HasPrefix(p.Charon, "/") {
			return fmt.Errorf("ipsec.charon: %q is not an absolute path", p.Charon)
		}
	}
	if p.MTU != 0 && (p.MTU < 1280 || p.MTU > 65535) {
		return fmt.Errorf("ipsec.mtu: %d is out of range (0 for automatic, or 1280..65535)", p.MTU)
	}
	return nil
}

// CheckRegistered checks that every driver in cableDrivers is one of registered (the drivers
// compiled into the binary); the error names the entry and lists the registered ones.
func (c *Config) CheckRegistered(registered []string) error {
	for i, d := range c.CableDrivers {
		if !slices.Contains(registered, d) {
			return fmt.Errorf("cableDrivers[%d]: %q is not a registered cable driver (have %s)", i, d, strings.Join(registered, ", "))
		}
	}
	return nil
}

// DriverSettings returns the cable.Settings map (as plain strings, so this package needs no
// driver) of driver name from the config; the drivers validate their keys again.
func (c *Config) DriverSettings(name string) map[string]string {
	itoa := strconv.Itoa
	switch name {
	case "wireguard":
		s := map[string]string{"interface": c.WireGuard.Interface, "port": itoa(c.WireGuard.Port)}
		if c.WireGuard.MTU != 0 {
			s["mtu"] = itoa(c.WireGuard.MTU)
		}
		return s
	case "vxlan":
		s := map[string]string{"port": itoa(c.VXLAN.Port), "vni": itoa(c.VXLAN.VNI)}
		if c.VXLAN.MTU != 0 {
			s["mtu"] = itoa(c.VXLAN.MTU)
		}
		return s
	case "ipsec":
		s := map[string]string{}
		if c.IPsec.UseSystemCharon != "" {
			s["useSystemCharon"] = c.IPsec.UseSystemCharon
		} else {
			s["port"], s["nattPort"], s["charon"] = itoa(c.IPsec.Port), itoa(c.IPsec.NATTPort), c.IPsec.Charon
		}
		if c.IPsec.MTU != 0 {
			s["mtu"] = itoa(c.IPsec.MTU)
		}
		return s
	}
	return map[string]string{}
}

func (h HealthCheck) validate() error {
	if h.Period < 100*time.Millisecond || h.Period > time.Hour {
		return fmt.Errorf("healthCheck.period: %q is out of range (100ms..1h)", h.Period)
	}
	if h.Timeout < 10*time.Millisecond {
		return fmt.Errorf("healthCheck.timeout: %q is too short (at least 10ms)", h.Timeout)
	}
	if h.Timeout > h.Period {
		return fmt.Errorf("healthCheck.timeout: %q is longer than healthCheck.period (%s); a probe must end before the next one starts", h.Timeout, h.Period)
	}
	if h.FailureThreshold < 1 || h.FailureThreshold > 100 {
		return fmt.Errorf("healthCheck.failureThreshold: %d is out of range (1..100)", h.FailureThreshold)
	}
	if h.Window < 1 || h.Window > 65536 {
		return fmt.Errorf("healthCheck.window: %d is out of range (1..65536)", h.Window)
	}
	return nil
}

func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("is not host:port")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("has no valid port (1..65535)")
	}
	return nil
}

func checkCIDRs(field string, cidrs []string) error {
	for i, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("%s[%d]: %q is not a CIDR", field, i, s)
		}
		if p != p.Masked() {
			return fmt.Errorf("%s[%d]: %q has host bits set (did you mean %s?)", field, i, s, p.Masked())
		}
	}
	return nil
}

// Prefixes parses CIDRs that Validate has accepted.
func Prefixes(cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// AdvertiseAddr returns the parsed advertise address (invalid when unset).
func (c *Config) AdvertiseAddr() netip.Addr {
	a, _ := netip.ParseAddr(c.AdvertiseAddress)
	return a
}
