package config

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

// The agent's config file is one struct, Config, as the operator writes it. A running agent
// holds it as two parts, so that the compiler, not a comment, says which fields a reload
// changes:
//
//   - Static is what a running agent never changes: a reload that changes any of it is refused
//     whole (Diff). Components are built with a Static and keep it for their life.
//   - Live is what a reload applies (liveFields). A component never holds a Live from its
//     start: it asks for the one in force (reload.Reloader.Live) or is handed the new one when
//     it changes (its ApplyConfig).
//
// Every field of Config is in exactly one of the two, under the same YAML path; the tags below
// name those paths (neither type is ever decoded) and static_test.go holds the three to each
// other and to liveFields. Both share the Config's lists and maps, which are read, never
// written, once the config is validated.

// Static is the part of the config a running agent never changes.
type Static struct {
	Cluster           string        `yaml:"cluster"`
	Node              string        `yaml:"node"`
	Broker            string        `yaml:"broker"`
	StateDir          string        `yaml:"stateDir"`
	Gateway           bool          `yaml:"gateway"`
	AdvertiseAddress  string        `yaml:"advertiseAddress"`
	PodCIDRs          []string      `yaml:"podCIDRs"`
	ServiceCIDRs      []string      `yaml:"serviceCIDRs"`
	StatusSocket      string        `yaml:"statusSocket"`
	LeaseSeconds      int           `yaml:"leaseSeconds"`
	HeartbeatInterval time.Duration `yaml:"heartbeatInterval"`
	ResyncInterval    time.Duration `yaml:"resyncInterval"`
	MetricsAddress    string        `yaml:"metricsAddress"`
	DNS               StaticDNS     `yaml:"dns"`
	CgroupPath        string        `yaml:"cgroupPath"`
	BPFPinDir         string        `yaml:"bpfPinDir"`
	LoadBalancer      LoadBalancer  `yaml:"loadBalancer"`
	Kubernetes        Kubernetes    `yaml:"kubernetes"`
	PolicyDir         string        `yaml:"policyDir"`
	Ingress           Ingress       `yaml:"ingress"`
}

// StaticDNS is the DNS server's static part: where it listens (a server is started or not at
// start).
type StaticDNS struct {
	Listen string `yaml:"listen"`
}

// Live is the part of the config a running agent applies without a restart.
type Live struct {
	// JoinTokenFile is read only before the first join.
	JoinTokenFile string   `yaml:"joinTokenFile"`
	CableDrivers  []string `yaml:"cableDrivers"`
	// Drivers are the drivers' blocks (a changed block rebuilds the driver).
	Drivers     map[string]cable.Settings `yaml:"-" json:"drivers"`
	LogLevel    string                    `yaml:"logLevel"`
	HealthCheck HealthCheck               `yaml:"healthCheck"`
	DNS         LiveDNS                   `yaml:"dns"`
	Exports     []Export                  `yaml:"exports"`
	Imports     Imports                   `yaml:"imports"`
}

// LiveDNS is what the DNS server that runs takes without a restart.
type LiveDNS struct {
	Upstream     StringList `yaml:"upstream"`
	TTL          int        `yaml:"ttl"`
	AllowClients []string   `yaml:"allowClients"`
}

// Static is c's static part.
func (c *Config) Static() Static {
	return Static{
		Cluster: c.Cluster, Node: c.Node, Broker: c.Broker, StateDir: c.StateDir, Gateway: c.Gateway,
		AdvertiseAddress: c.AdvertiseAddress, PodCIDRs: c.PodCIDRs, ServiceCIDRs: c.ServiceCIDRs,
		StatusSocket: c.StatusSocket, LeaseSeconds: c.LeaseSeconds, HeartbeatInterval: c.HeartbeatInterval,
		ResyncInterval: c.ResyncInterval, MetricsAddress: c.MetricsAddress, DNS: StaticDNS{Listen: c.DNS.Listen},
		CgroupPath: c.CgroupPath, BPFPinDir: c.BPFPinDir, LoadBalancer: c.LoadBalancer, Kubernetes: c.Kubernetes,
		PolicyDir: c.PolicyDir, Ingress: c.Ingress,
	}
}

// Live is c's live part.
func (c *Config) Live() Live {
	return Live{
		JoinTokenFile: c.JoinTokenFile, CableDrivers: c.CableDrivers, Drivers: c.Drivers, LogLevel: c.LogLevel,
		HealthCheck: c.HealthCheck, DNS: LiveDNS{Upstream: c.DNS.Upstream, TTL: c.DNS.TTL, AllowClients: c.DNS.AllowClients},
		Exports: c.Exports, Imports: c.Imports,
	}
}

// AdvertiseAddr returns the parsed advertise address (invalid when unset).
func (s Static) AdvertiseAddr() netip.Addr {
	a, _ := netip.ParseAddr(s.AdvertiseAddress)
	return a
}

// SlogLevel is LogLevel as a slog level; a value Validate would refuse reads as info.
func (l Live) SlogLevel() slog.Level {
	switch l.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// ExportsProto returns the exports, normalised (Validate has accepted them).
func (l Live) ExportsProto() []*apiv1.ServiceExport {
	out := make([]*apiv1.ServiceExport, 0, len(l.Exports))
	for i, e := range l.Exports {
		if p, err := NormalizeExport(fmt.Sprintf("exports[%d]", i), e); err == nil {
			out = append(out, p)
		}
	}
	return out
}
