package broker

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"google.golang.org/grpc"

	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Defaults, as DESIGN.md and the agreed wire facts give them.
const (
	DefaultListen        = "0.0.0.0:7443"
	DefaultLease         = 30 * time.Second
	DefaultMaxLease      = 5 * time.Minute
	DefaultTokenValidity = 24 * time.Hour
	MaxTokenValidity     = 365 * 24 * time.Hour
	AdminConfigFile      = "admin.yaml"
	StoreFile            = "broker.db"
)

// Config configures a broker.
type Config struct {
	// DataDir holds broker.db, the PKI and admin.yaml. Required.
	DataDir string
	// Listen is the address the broker will serve on; its IP goes into the serving certificate.
	Listen string
	// Lease is the default endpoint lease (default 30s); MaxLease caps what an agent may ask for
	// (default 5m).
	Lease    time.Duration
	MaxLease time.Duration
	// ReapInterval is how often expired endpoints are withdrawn. Default (0): a tenth of the
	// shortest lease a registered endpoint holds, or of Lease when none is shorter, at least
	// 100ms, so that an endpoint that asked for a short lease (a cluster with several gateways
	// that wants fast failover) is withdrawn soon after it expires, not up to Lease/10 later.
	ReapInterval time.Duration
	// DefaultCableDriver is the driver of the mesh default policy the broker creates at first
	// start: one of the registered cable drivers (cable.Names; the cable-broker binary links them
	// all). Empty means wireguard. Later starts keep the stored default policy (an operator may
	// have changed it with apply) and only log when this differs.
	DefaultCableDriver string
	// ServiceVIPRanges are the ranges clusterset VIPs come from: at most one IPv4 and one IPv6
	// prefix (a service gets one VIP from each). Default mcs.DefaultVIPRange. A stored VIP
	// outside them (the ranges changed since) is kept and logged, never renumbered.
	ServiceVIPRanges []netip.Prefix
	// MeshAddressRange is the IPv4 range gateways' mesh addresses come from (gateway mode, issue
	// 9): default meshaddr.DefaultRange; /8 to /30; it must not overlap ServiceVIPRanges, and no
	// cluster's CIDRs may overlap it. A stored address outside it (the range changed since) is
	// replaced by one inside it at start and at the node's next registration.
	MeshAddressRange netip.Prefix
	// ExportQuota bounds what the nodes of one cluster export together (services, endpoints,
	// importers' load balancer entries); fields left 0 take admission's defaults.
	ExportQuota admission.ExportQuota
	// StoreOptions tune the embedded store (event log size, watcher buffer).
	StoreOptions store.Options
	// Store, when set, is the store to use instead of the embedded one in DataDir/broker.db
	// (StoreOptions are then not used), e.g. store.Memory in tests. The server owns it: Close
	// closes it, and so does New when it fails.
	Store store.Store
	// Etcd, when set, keeps the store and the shared secrets (mesh CA, join-token key, mesh
	// secret) in etcd, so that several replicas serve one mesh (see ha.go). Exclusive with Store.
	Etcd   *EtcdConfig
	Logger *slog.Logger
	// WatchMessageBytes is the most a watch message may hold before a batch is sent in parts
	// (default DefaultWatchMessageBytes; agents receive at most 4 MiB).
	WatchMessageBytes int
	// SelfAddresses are the broker's own addresses, which no cluster's pod or service CIDR may
	// cover: default the listen address when it is a specific IP, else every interface
	// address (tests inject them).
	SelfAddresses func() ([]netip.Addr, error)
	// Now is the clock (tests move it); default time.Now. Leases, token expiry and the reaper
	// read it.
	Now func() time.Time
	// StartTimeout bounds the store work New does after opening the store (the default policy,
	// service VIPs, mesh addresses, leases), so that a store that does not answer fails the
	// start instead of hanging it; default DefaultStartTimeout. Opening an etcd store is bounded
	// apart, by EtcdConfig.StartTimeout.
	StartTimeout time.Duration
	// LinkReportInterval is how often gateways send their full link report (the summary;
	// changes go at once), default DefaultLinkReportInterval; a report is stale after three.
	// LinkReportMinInterval is the shortest time between two accepted reports of one node (the
	// rate limit), default DefaultLinkReportMinInterval.
	LinkReportInterval, LinkReportMinInterval time.Duration
	// AgentCertificateLifetime is how long the agent certificates issued from now on last
	// (joins and renewals): default and at most DefaultAgentCertificateLifetime (one year), at
	// least MinAgentCertificateLifetime. Agents renew two thirds into a certificate's lifetime, so a shorter
	// one bounds how long a stolen certificate stays useful, at the price of more renewals.
	AgentCertificateLifetime time.Duration
	// UnaryInterceptors and StreamInterceptors run around every call after the broker's own
	// (metrics, then authentication: a call they see is authenticated), outermost first: for
	// auditing, tracing, or a test that refuses or observes calls. A Watch stream's SendMsg gets
	// messages the broker encoded once for many watchers as PreEncoded.
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
}

// MinAgentCertificateLifetime is the shortest Config.AgentCertificateLifetime (for tests and
// drills: an agent must renew within the last third of it); DefaultAgentCertificateLifetime,
// pki.Validity, is the default and the longest.
const (
	MinAgentCertificateLifetime     = time.Second
	DefaultAgentCertificateLifetime = pki.Validity
)

// DefaultStartTimeout is Config.StartTimeout's default.
const DefaultStartTimeout = 60 * time.Second

// agentCertificateLifetime is Config.AgentCertificateLifetime checked, with its default.
func agentCertificateLifetime(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return DefaultAgentCertificateLifetime, nil
	}
	if err := ValidateAgentCertificateLifetime(d); err != nil {
		return 0, fmt.Errorf("config: AgentCertificateLifetime: %w", err)
	}
	return d, nil
}

// ValidateAgentCertificateLifetime checks an agent certificate lifetime: from
// MinAgentCertificateLifetime to DefaultAgentCertificateLifetime.
func ValidateAgentCertificateLifetime(d time.Duration) error {
	if d < MinAgentCertificateLifetime || d > DefaultAgentCertificateLifetime {
		return fmt.Errorf("agent certificate lifetime %s is outside %s to %s", d, MinAgentCertificateLifetime, DefaultAgentCertificateLifetime)
	}
	return nil
}
