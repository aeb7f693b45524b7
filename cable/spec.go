package cable

import "time"

// Spec is what the rest of Cablemesh knows about a driver without linking its datapath: its
// name, how it checks its settings, options and published attributes, and its traits. Each
// driver's spec package registers one (RegisterSpec); the broker, the policy resolver and
// cablectl use it, the agent too.
type Spec struct {
	// Name is the registry key, the driver's name in policies, the agent config and endpoints.
	Name string
	// ParseSettings validates the driver's block of the agent config without I/O; errors name
	// the field as "<driver>.<key>" and the value. nil accepts only an empty block.
	ParseSettings func(Settings) error
	// ValidateOptions validates the per-connection options a policy gives the driver
	// (cableDriver.options); errors name the option and the value. nil accepts only none.
	ValidateOptions func(Options) error
	// CheckPublished validates what a remote node published for this driver
	// (cable_attributes[driver]); an endpoint that fails it cannot carry the driver. nil accepts
	// anything.
	CheckPublished func(attrs map[string]string) error
	// OptIn drivers run only where the agent config names them in cableDrivers: they need
	// kernel support many nodes lack (vxlan+ipsec needs ESP in the kernel), and a default that
	// fails on those nodes would only be noise in every gateway's status.
	OptIn bool
	// Traits describe the driver's nature to tools that judge its connections.
	Traits Traits
}

// Traits are what a tool above cable/ needs to know of a driver's nature to judge and show its
// connections (cablectl's diagnose and tables), so that no tool switches on a driver's name.
type Traits struct {
	// Label is the driver's protocol as prose names it ("WireGuard"); empty means Name.
	Label string
	// Handshake is how a connection shows that the remote end answers.
	Handshake Handshake
	// HandshakeLifetime, for a SessionHandshake, is how long one handshake's session carries
	// traffic (WireGuard's REJECT_AFTER_TIME): with traffic flowing, a newer handshake is due.
	HandshakeLifetime time.Duration
	// HandshakeNote is what an operator should know when no handshake completes (e.g. that a key
	// mismatch is silent, or which ports the handshake uses).
	HandshakeNote string
	// Daemon names the helper daemon the driver runs beside the agent ("charon"); empty for none.
	Daemon string
	// OwnsDaemonName: this driver's daemon is the one reports call by the daemon's plain name
	// ("charon"); another driver's daemon of that name is "charon <driver>".
	OwnsDaemonName bool
	// PublicKeyAttribute is the attribute (cable_attributes[driver]) holding the node's public
	// key, for a driver that has one; empty otherwise.
	PublicKeyAttribute string
}

// Handshake is how a driver's connection shows that the remote end answers.
type Handshake int

const (
	// NoHandshake: nothing but traffic through the tunnel (the agent's probes) tells.
	NoHandshake Handshake = iota
	// SessionHandshake: the ends handshake again and again; a connection reports its last one,
	// and a session older than Traits.HandshakeLifetime carries nothing (WireGuard).
	SessionHandshake
	// EstablishedHandshake: a handshake establishes a security association the connection's
	// state reports as connected, with the time it was established (IPsec's IKE_SA).
	EstablishedHandshake
)

// DisplayLabel is Traits.Label, or the driver's name when it has none.
func (s Spec) DisplayLabel() string {
	if s.Traits.Label != "" {
		return s.Traits.Label
	}
	return s.Name
}

// DefaultDriver is the driver of the mesh's default policy (full mesh) when the broker is told
// no other: it must be a registered, non-opt-in driver (cable/specs' tests check it).
const DefaultDriver = "wireguard"
