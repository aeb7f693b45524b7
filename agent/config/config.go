// Package config is the cable-agent configuration file: strict YAML (unknown fields are errors),
// defaults applied after decoding, and validation whose errors name the field and the value.
//
// Every field below is documented with its default; docs/agent-config.md repeats them for
// operators and must be kept in step with this file. The blocks of the cable drivers
// (`wireguard:`, `vxlan:`, ...) are not this package's: it hands each to its driver through the
// cable registry, which validates it and fills its defaults (see Config.Drivers).
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/cable"
)

// Defaults. They are exported so the agent, its docs and its tests agree on one value.
const (
	DefaultStateDir          = "/var/lib/cablemesh"
	DefaultStatusSocket      = "/run/cablemesh/agent.sock"
	DefaultLeaseSeconds      = 30
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultResyncInterval    = 30 * time.Second
	DefaultLogLevel          = "info"

	// Health probes: a probe every 300ms, a gateway down after 3 failures in a row, so a dead
	// gateway leaves the service maps 0.9-1.2s after it died (failover in under 2s).
	// Linkerd's gateway probes (3s x 3, timeout 2s) remain reachable by config. They are the
	// values of agent/health's defaults, repeated here so the config package stays free of I/O
	// imports.
	DefaultHealthCheckPeriod           = 300 * time.Millisecond
	DefaultHealthCheckTimeout          = 300 * time.Millisecond
	DefaultHealthCheckFailureThreshold = 3
	DefaultHealthCheckWindow           = 128
)

// DefaultCableDrivers are the drivers a gateway runs when cableDrivers is not set: every driver
// registered in the binary, sorted.
func DefaultCableDrivers() []string { return cable.DefaultNames() }

// Config is the whole agent configuration file.
type Config struct {
	// Cluster is the name of the cluster this node belongs to: a DNS label (lower-case letters,
	// digits and '-', at most 63 characters). It must match the cluster the join token was
	// issued for. Required.
	Cluster string `yaml:"cluster" json:"cluster"`
	// Node is this node's name, unique inside its cluster: a DNS subdomain (lower-case letters,
	// digits, '-' and '.', at most 253 characters), as the broker requires. Default: the host
	// name, lower-cased (as the kubelet does); a host name that is still no valid node name (one
	// with '_', say) is an error that asks for node to be set.
	Node string `yaml:"node" json:"node"`
	// Broker is the broker's gRPC address, host:port, or several replicas' (HA on etcd),
	// host:port[,host:port...]: the agent keeps a connection to each and fails over between them.
	// No cable route ever covers one of these addresses (host names are resolved once, at
	// start). Required.
	Broker string `yaml:"broker" json:"broker"`
	// JoinTokenFile is the file holding the join token printed by `cablectl cluster join-token`.
	// It is read only when StateDir has no agent certificate yet (first start). Default: none;
	// required on first start (unset, missing or unreadable then: exit 2, preflight.CheckFiles). It
	// should be readable by the agent alone (the agent warns otherwise) and can be deleted once
	// the node has joined.
	JoinTokenFile string `yaml:"joinTokenFile" json:"joinTokenFile"`
	// StateDir holds the agent's key and certificate (agent.key, agent.crt, ca.crt: replaced by
	// renewals and CA rotations), the last broker state (broker-state.json) and the drivers'
	// persistent files (wireguard/ keys). It must be a directory or not exist yet (exit 2 if it is
	// a file, preflight.CheckFiles). Default: /var/lib/cablemesh.
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
	// most once. Default: all registered drivers, sorted by name.
	CableDrivers []string `yaml:"cableDrivers" json:"cableDrivers"`
	// Drivers are the cable drivers' own blocks of the file: every top-level key that names a
	// registered driver (`wireguard: {interface: cbl-wg0}`), holding exactly the keys the
	// operator wrote, each value in its scalar text form. The driver validates its block and
	// fills its defaults (cable.ParseSettings); a block may be given for a driver cableDrivers
	// leaves out, and is validated all the same. Default: none (every driver's defaults).
	Drivers map[string]cable.Settings `yaml:"-" json:"drivers,omitempty"`
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

	// DNS is the clusterset.local DNS server (off while dns.listen is empty).
	DNS DNS `yaml:"dns" json:"dns"`
	// CgroupPath is the cgroup2 directory the eBPF socket load balancer's hooks attach to: they
	// translate the service VIPs of every process below it. Default: "" (the cgroup2 root,
	// detected at start: /sys/fs/cgroup on a unified layout, /sys/fs/cgroup/unified on a hybrid
	// one).
	CgroupPath string `yaml:"cgroupPath" json:"cgroupPath,omitempty"`
	// BPFPinDir is this agent's directory on a bpf filesystem, where the services datapath pins
	// its maps and links so that they outlive an agent restart. The agent mounts bpffs at
	// /sys/fs/bpf when the directory lies below it and it is not mounted. Default:
	// /sys/fs/bpf/cablemesh.
	BPFPinDir string `yaml:"bpfPinDir" json:"bpfPinDir"`
	// LoadBalancer sizes the eBPF socket load balancer's maps.
	LoadBalancer LoadBalancer `yaml:"loadBalancer" json:"loadBalancer,omitzero"`
	// Imports picks the services this cluster imports.
	Imports Imports `yaml:"imports" json:"imports"`
	// Exports are the services this node exports; more can be added at run time with `cablectl
	// service export --socket` (kept in stateDir/exports.json). Default: none.
	Exports []Export `yaml:"exports" json:"exports,omitempty"`
	// Kubernetes turns on exports from MCS ServiceExport objects.
	Kubernetes Kubernetes `yaml:"kubernetes" json:"kubernetes"`
	// PolicyDir holds this cluster's cluster-scoped ClusterConnectionPolicies, one or
	// more YAML documents per *.yaml, *.yml or *.json file, watched for changes: each must carry
	// the label cablemesh.io/origin: cluster, decides only pairs that include this cluster, and
	// is synced to the broker as <name>-<hash>. Run it on one node of the cluster (a gateway).
	// Default: none.
	PolicyDir string `yaml:"policyDir" json:"policyDir,omitempty"`
	// Ingress is the gateway's ingress: ingress ports, data plane, xDS server (ingress.go).
	Ingress Ingress `yaml:"ingress" json:"ingress"`

	// nodeFromHost is the host name Node was defaulted from ("" when the file set it), so that
	// an invalid node name says where it came from.
	nodeFromHost string
	// driverLines are where the driver blocks were in the file, for errors (nil when the config
	// was not decoded from a file).
	driverLines map[string]blockLines
}

// HealthCheck configures the gateway-to-gateway probes: an ICMP echo every period from this
// node's health-check address (its address inside its pod CIDRs) to each remote endpoint's
// health_check_ip, through the tunnel. failureThreshold failures in a row put the connection in
// state error; one answer recovers it. A remote endpoint without a health_check_ip is not
// probed (its state comes from the device alone).
type HealthCheck struct {
	// Enabled turns probing on or off. Default: true.
	Enabled *bool `yaml:"enabled" json:"enabled"`
	// Period between two probes of one connection, a Go duration, 100ms..1h. Default: 300ms.
	Period time.Duration `yaml:"period" json:"period"`
	// Timeout is how long a probe waits for its answer, at least 10ms and at most period.
	// Default: 300ms (or period, if shorter).
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

// maxSize bounds the config file: anything larger is not a config file.
const maxSize = 1 << 20

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent config: %w", err)
	}
	return ParseFile(path, data)
}

// ParseFile is Load of data already read from path: a running agent reads the file once to hash
// it and parses the very bytes it hashed.
func ParseFile(path string, data []byte) (*Config, error) {
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

// NodeNameEnv names the environment variable the default node name comes from before the host
// name: the DaemonSet sets it from the downward API (spec.nodeName), because the kubelet's node
// name need not be the host name (--hostname-override, cloud providers), and the agent must find
// its Node object by it. Read at every load, so a reloaded config defaults the same way.
const NodeNameEnv = "NODE_NAME"

// hostname is the default node name's source: $NODE_NAME when set, else the host name; a
// variable so tests can pin it.
var hostname = func() string {
	if n := os.Getenv(NodeNameEnv); n != "" {
		return n
	}
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

// ApplyDefaults fills every unset field with its documented default. host supplies the host
// name the node name defaults to (validation.NodeNameFromHost of it). The drivers' blocks are
// left as written: their defaults are the drivers'.
func (c *Config) ApplyDefaults(host func() string) {
	if c.Node == "" && host != nil {
		if h := host(); h != "" {
			c.Node, c.nodeFromHost = validation.NodeNameFromHost(h), h
		}
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.StatusSocket == "" {
		c.StatusSocket = DefaultStatusSocket
	}
	if c.CableDrivers == nil {
		c.CableDrivers = DefaultCableDrivers()
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
	c.applyServicesDefaults()
	c.applyIngressDefaults()
}

// Validate checks every field; the error names the first bad field and its value.
func (c *Config) Validate() error {
	if c.Cluster == "" {
		return errors.New("cluster: is required")
	}
	if err := validation.ValidateClusterName(c.Cluster); err != nil {
		return fmt.Errorf("cluster: %q: %w", c.Cluster, err)
	}
	if err := c.validateNode(); err != nil {
		return err
	}
	if c.Broker == "" {
		return errors.New("broker: is required (host:port of the broker)")
	}
	for _, addr := range strings.Split(c.Broker, ",") {
		if err := checkHostPort(strings.TrimSpace(addr)); err != nil {
			if addr == c.Broker {
				return fmt.Errorf("broker: %q %v", c.Broker, err)
			}
			return fmt.Errorf("broker: %q: %q %v (want host:port[,host:port...])", c.Broker, strings.TrimSpace(addr), err)
		}
	}
	if c.Gateway && c.AdvertiseAddress == "" && !c.Kubernetes.Enabled {
		// On Kubernetes the Node's InternalIP stands in for it (agent/reload_nodeaddr.go).
		return errors.New("advertiseAddress: is required when gateway is true (with kubernetes.enabled it defaults to the Node's InternalIP)")
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
	if c.PolicyDir != "" && !strings.HasPrefix(c.PolicyDir, "/") {
		return fmt.Errorf("policyDir: %q is not an absolute path", c.PolicyDir)
	}
	// sun_path holds 108 bytes including the terminating NUL.
	if len(c.StatusSocket) > 107 {
		return fmt.Errorf("statusSocket: %q is longer than the 107 bytes a unix socket path may have", c.StatusSocket)
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
	if err := c.HealthCheck.validate(); err != nil {
		return err
	}
	if err := c.validateServices(); err != nil {
		return err
	}
	return c.validateIngress()
}

// validateNode checks the node name with the broker's rule, saying where an invalid one came
// from: a name the broker would refuse at join must stop the agent before it starts.
func (c *Config) validateNode() error {
	if c.Node == "" {
		return errors.New("node: is required (no host name to default to)")
	}
	err := validation.ValidateNodeName(c.Node)
	if err == nil {
		return nil
	}
	if c.nodeFromHost != "" {
		return fmt.Errorf("node: %q, defaulted from the host name %q, is not a valid node name: %w; set node: in the agent config", c.Node, c.nodeFromHost, err)
	}
	return fmt.Errorf("node: %q, set in the agent config, is not a valid node name: %w", c.Node, err)
}

// validateDrivers checks cableDrivers against the registry and has every driver named there or
// given a block validate its settings.
func (c *Config) validateDrivers() error {
	if len(c.CableDrivers) == 0 {
		return errors.New("cableDrivers: is empty (list at least one driver, or leave it unset for all registered drivers)")
	}
	registered := cable.Names()
	for i, d := range c.CableDrivers {
		if validation.ValidateDriverName("cableDrivers", d) != nil {
			return fmt.Errorf("cableDrivers[%d]: %q is not a driver name", i, d)
		}
		if slices.Index(c.CableDrivers, d) != i {
			return fmt.Errorf("cableDrivers[%d]: %q is listed twice", i, d)
		}
		if !slices.Contains(registered, d) {
			return fmt.Errorf("cableDrivers[%d]: %q is not a registered cable driver (have %s)", i, d, strings.Join(registered, ", "))
		}
	}
	names := slices.Sorted(maps.Keys(c.Drivers))
	for _, d := range c.CableDrivers {
		if _, ok := c.Drivers[d]; !ok {
			names = append(names, d)
		}
	}
	for _, d := range names {
		if err := cable.ParseSettings(d, c.Drivers[d]); err != nil {
			return c.driverLines[d].locate(d, err)
		}
	}
	return nil
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

// checkCIDRs applies the broker's CIDR rule (validation.ParseCIDR) to every entry.
func checkCIDRs(field string, cidrs []string) error {
	for i, s := range cidrs {
		if _, err := validation.ParseCIDR(fmt.Sprintf("%s[%d]:", field, i), s); err != nil {
			return err
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

// SlogLevel is LogLevel as a slog level; a value Validate would refuse reads as info.
func (c *Config) SlogLevel() slog.Level { return c.Live().SlogLevel() }

// AdvertiseAddr returns the parsed advertise address (invalid when unset).
func (c *Config) AdvertiseAddr() netip.Addr { return c.Static().AdvertiseAddr() }
