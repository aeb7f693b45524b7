package bpf

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
)

// Proto is an IP protocol number, as services are keyed by it.
type Proto uint8

// The protocols a service can have. SCTP services are keyed like the others; the connect hooks
// translate them, but socket destroy covers TCP and UDP only (no kernel iterator or sock_diag
// destroy exists for SCTP).
const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

func (p Proto) valid() bool { return p == TCP || p == UDP || p == SCTP }

// MaxBackendsPerService bounds a service's backends; Sync refuses a service with more.
const MaxBackendsPerService = 1024

// Backend is one eligible destination of a service: the agent has already applied readiness,
// health and local-cluster affinity, so the load balancer spreads evenly over all of them.
type Backend struct {
	Addr      netip.Addr
	Port      uint16
	ClusterID uint32
}

func (b Backend) String() string {
	return fmt.Sprintf("%s (cluster %d)", addrPort(b.Addr, b.Port), b.ClusterID)
}

// Service is a clusterset VIP, port and protocol with its backends. A service with no backends
// stays in the maps so that connect() to it fails at once (EHOSTUNREACH) instead of hanging.
type Service struct {
	VIP      netip.Addr
	Port     uint16
	Proto    Proto
	Backends []Backend
}

func (s Service) String() string { return addrPort(s.VIP, s.Port) + "/" + s.Proto.String() }

// addrPort formats an address and port, also when the address is missing (bad input is
// reported with it).
func addrPort(a netip.Addr, port uint16) string {
	if !a.IsValid() {
		return fmt.Sprintf("<no address>:%d", port)
	}
	return netip.AddrPortFrom(a, port).String()
}

func (s Service) key() svcKey { return svcKey{vip: s.VIP, port: s.Port, proto: s.Proto} }

// Endpoint is a backend as sockets see it: the peer address, port and protocol of the
// connections that DestroySockets aborts.
type Endpoint struct {
	Addr  netip.Addr
	Port  uint16
	Proto Proto
}

func (e Endpoint) String() string { return addrPort(e.Addr, e.Port) + "/" + e.Proto.String() }

// DestroyMethod says how DestroySockets finds and aborts sockets.
type DestroyMethod string

const (
	// DestroyAuto uses DestroyIterator where the kernel has the bpf_sock_destroy kfunc (6.5+)
	// and DestroySockDiag otherwise.
	DestroyAuto DestroyMethod = ""
	// DestroyIterator runs TCP and UDP socket iterators that call bpf_sock_destroy.
	DestroyIterator DestroyMethod = "iterator"
	// DestroySockDiag lists sockets and destroys them over netlink sock_diag (SOCK_DESTROY,
	// which needs CONFIG_INET_DIAG_DESTROY).
	DestroySockDiag DestroyMethod = "sock_diag"
)

// ErrDestroyUnsupported is wrapped by DestroySockets' error when the kernel can destroy
// sockets neither with the bpf_sock_destroy kfunc nor over sock_diag.
var ErrDestroyUnsupported = errors.New("socket destroy is not supported by this kernel")

// Options configure Open and OpenCounters.
type Options struct {
	// PinDir is this agent's directory on a bpf filesystem (e.g. /sys/fs/bpf/cablemesh), where
	// maps and links are pinned so that they outlive the agent. bpffs must be mounted by the
	// caller (mount -t bpf bpf /sys/fs/bpf); Open creates the directory itself.
	PinDir string
	// CgroupPath is the cgroup2 directory the socket hooks attach to: the root of cgroup2 on a
	// node (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid layout), a child in tests.
	// The hooks see the sockets of every process below it, whatever its network namespace.
	CgroupPath string
	// Log receives what the loader decided (adopted, updated, attached); nil discards.
	Log *slog.Logger
	// DestroyMethod chooses how DestroySockets works; the zero value picks by kernel.
	DestroyMethod DestroyMethod
	// ServiceMapEntries and BackendMapEntries size the service map (services plus their
	// backend slots) and the backend map; 0 means DefaultServiceMapEntries and
	// DefaultBackendMapEntries. Maps already pinned in PinDir keep the size they were created
	// with (resizing would lose the state of open sockets): Open logs the difference, and the
	// new size takes effect once the pins are removed (cleanup on exit, or Purge).
	ServiceMapEntries, BackendMapEntries int
}

// The compiled sizes of the service and backend maps (LB_MAX_SERVICE_ENTRIES and
// LB_MAX_BACKENDS in c/lb.h). They are preallocated hash maps: the kernel reserves their memory
// when they are created, measured at 96 bytes per service map entry and 104 per backend map
// entry (memlock), so 65,536 of each cost 12.5 MiB per node (docs/limits.md).
const (
	DefaultServiceMapEntries = 65536
	DefaultBackendMapEntries = 65536
	// MinMapEntries and MaxMapEntries bound Options.ServiceMapEntries and BackendMapEntries.
	MinMapEntries = 16
	MaxMapEntries = 1 << 22
)

func (o Options) logger() *slog.Logger {
	if o.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Log
}

// ClusterCounters are the traffic counters of one remote cluster on the cable interfaces.
// Bytes are counted as the packets are at tc, with the link-layer header where the device
// has one.
type ClusterCounters struct {
	RxPackets, RxBytes, TxPackets, TxBytes uint64
}

// ValidMapEntries checks a configured map size.
func ValidMapEntries(n int) error {
	if n < MinMapEntries || n > MaxMapEntries {
		return fmt.Errorf("%d map entries: want %d to %d", n, MinMapEntries, MaxMapEntries)
	}
	return nil
}
