// Package spec is the vxlan+ipsec cable driver's spec: its name, the settings and options it
// takes, what a node publishes for it, and its traits. It does no I/O and links no datapath, so
// the broker and cablectl use it without cable/vxlanipsec. It checks the embedded drivers' parts
// with their specs, through the registry.
package spec

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cablemesh/cablemesh/cable"
	ipsecspec "github.com/cablemesh/cablemesh/cable/ipsec/spec"
	vxlanspec "github.com/cablemesh/cablemesh/cable/vxlan/spec"
)

// Name is the registry key of this driver.
const Name = "vxlan+ipsec"

func init() {
	cable.RegisterSpec(cable.Spec{
		Name:            Name,
		OptIn:           true, // kernel ESP only: most of today's test hosts would refuse it
		ParseSettings:   cable.Check(ParseSettings),
		ValidateOptions: cable.Check(ParseOptions),
		CheckPublished:  CheckPublished,
		Traits:          cable.Traits{Label: "VXLAN+IPsec", Handshake: cable.NoHandshake, Daemon: "charon"},
	})
}

// Defaults of the node-level settings (the agent Config's `vxlan+ipsec:` block). The ports differ
// from the vxlan and ipsec drivers' so that all three run side by side on one gateway: another
// VXLAN port keeps the transport-mode selectors off the plain vxlan cable's traffic, other IKE
// ports let this driver's charon run beside the ipsec driver's.
const (
	DefaultVXLANPort       = 4799
	DefaultVNI             = vxlanspec.DefaultVNI
	DefaultInterfacePrefix = "cbl-vi"
	DefaultIKEPort         = 4510
	DefaultNATTPort        = 4511
)

// ESPTransportOverhead is what ESP in transport mode with AES-GCM-16 (the default proposal, and
// the only kind this driver takes) adds to a packet over IPv4 without UDP encapsulation: ESP
// header 8 + IV 8 + padding at most 3 (4-byte alignment) + pad length and next header 2 + ICV 16.
// Transport mode adds no outer IP header: the VXLAN packet's own is kept.
const ESPTransportOverhead = 8 + 8 + 3 + 2 + 16

// Overhead is everything this cable adds to an inner packet: VXLAN's and ESP's.
const Overhead = vxlanspec.Overhead + ESPTransportOverhead

// Setting keys:
//
//	vxlanPort        UDP port of this node's VXLAN link, published as cable_attributes (4799)
//	vni              VNI of the default link; equal at both ends (100)
//	mtu              MTU of the VXLAN links; 0 or unset: underlay MTU - Overhead (87)
//	interfacePrefix  name prefix of the VXLAN links, at most 6 bytes (cbl-vi)
//	ikePort          IKE port of this driver's charon, published as cable_ports (4510)
//	nattPort         NAT-T port of this driver's charon (4511)
//	charon           the charon binary (/usr/lib/ipsec/charon)
const (
	keyVXLANPort       = "vxlanPort"
	keyVNI             = "vni"
	keyMTU             = "mtu"
	keyInterfacePrefix = "interfacePrefix"
	KeyIKEPort         = "ikePort"
	keyNATTPort        = "nattPort"
	keyCharon          = "charon"
)

var settingKeys = []string{keyVXLANPort, keyVNI, keyMTU, keyInterfacePrefix, KeyIKEPort, keyNATTPort, keyCharon}

// Option keys (the policy's cableDriver.options).
const (
	optVNI          = "vni"
	optMTU          = "mtu"
	optIKEProposals = "ikeProposals"
	optESPProposals = "espProposals"
)

// AttrVXLANPort is the attribute (cable_attributes["vxlan+ipsec"]) holding the node's VXLAN port;
// its cable_ports entry is the IKE port.
const AttrVXLANPort = "vxlanPort"

// Config is the validated settings, split into the two embedded drivers' own settings.
type Config struct {
	VXLANPort int
	VXLAN     cable.Settings // for vxlan.NewEmbedded
	IPsec     cable.Settings // for ipsec.NewEmbedded
}

// ParseSettings validates the block and fills defaults, without I/O. Every error is a
// *cable.SettingError of this driver ("vxlan+ipsec.<key>: <value> <reason>"), also those the
// embedded drivers' own rules find, so the operator reads the key they wrote.
func ParseSettings(s cable.Settings) (Config, error) {
	c := Config{
		VXLANPort: DefaultVXLANPort,
		VXLAN:     cable.Settings{"port": strconv.Itoa(DefaultVXLANPort), "vni": strconv.Itoa(DefaultVNI), "interfacePrefix": DefaultInterfacePrefix},
		IPsec:     cable.Settings{"port": strconv.Itoa(DefaultIKEPort), "nattPort": strconv.Itoa(DefaultNATTPort), "datapath": string(ipsecspec.DatapathKernel)},
	}
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case keyVXLANPort:
			// The kernel's source port range ends one above the port (vxlanspec.MaxPinnedPort).
			c.VXLANPort, err = cable.IntSetting(Name, k, v, 1, vxlanspec.MaxPinnedPort)
			c.VXLAN["port"] = v
		case keyVNI:
			_, err = cable.IntSetting(Name, k, v, 1, vxlanspec.MaxVNI)
			c.VXLAN["vni"] = v
		case keyMTU:
			_, err = cable.MTUSetting(Name, k, v, vxlanspec.MinMTU, vxlanspec.MaxMTU)
			c.VXLAN["mtu"] = v
		case keyInterfacePrefix:
			err = checkPrefix(v)
			c.VXLAN["interfacePrefix"] = v
		case KeyIKEPort:
			_, err = cable.PortSetting(Name, k, v)
			c.IPsec["port"] = v
		case keyNATTPort:
			_, err = cable.PortSetting(Name, k, v)
			c.IPsec["nattPort"] = v
		case keyCharon:
			c.IPsec["charon"] = v
		default:
			err = cable.UnknownSetting(Name, k, v, settingKeys...)
		}
		if err != nil {
			return Config{}, err
		}
	}
	if c.IPsec["port"] == c.IPsec["nattPort"] {
		return Config{}, cable.BadSetting(Name, keyNATTPort, c.IPsec["nattPort"], "equals %s.%s; charon needs two different ports", Name, KeyIKEPort)
	}
	if c.IPsec["port"] == strconv.Itoa(c.VXLANPort) || c.IPsec["nattPort"] == strconv.Itoa(c.VXLANPort) {
		return Config{}, cable.BadSetting(Name, keyVXLANPort, strconv.Itoa(c.VXLANPort), "is also an IKE port of %s; VXLAN and IKE need different ports", Name)
	}
	// The embedded drivers' own rules, reported under this driver's name and keys.
	if err := cable.ParseSettings(vxlanspec.Name, c.VXLAN); err != nil {
		return Config{}, Rename(err, map[string]string{"port": keyVXLANPort})
	}
	if err := cable.ParseSettings(ipsecspec.Name, c.IPsec); err != nil {
		return Config{}, Rename(err, map[string]string{"port": KeyIKEPort})
	}
	return c, nil
}

// Rename turns an embedded driver's SettingError into this driver's, with our key names.
func Rename(err error, keys map[string]string) error {
	se, ok := err.(*cable.SettingError)
	if !ok {
		return fmt.Errorf("%s: %w", Name, err)
	}
	out := *se
	out.Driver = Name
	if k, ok := keys[se.Key]; ok {
		out.Key = k
	}
	out.Reason = strings.ReplaceAll(out.Reason, se.Driver+".", Name+".")
	return &out
}

// checkPrefix: the VXLAN link prefix must leave room for the VNI, and must not be a prefix of
// the vxlan driver's default links (or they of it): each driver deletes every VXLAN link that
// starts with its prefix as its own.
func checkPrefix(p string) error {
	if len(p) > 6 {
		return cable.BadSetting(Name, keyInterfacePrefix, p, "is %d bytes: at most 6 leave room for the VNI in the kernel's 15", len(p))
	}
	if err := cable.CheckLinkName(p, 6); err != nil {
		return cable.BadSetting(Name, keyInterfacePrefix, p, "%v", err)
	}
	if strings.HasPrefix(p, vxlanspec.DefaultInterfacePrefix) || strings.HasPrefix(vxlanspec.DefaultInterfacePrefix, p) {
		return cable.BadSetting(Name, keyInterfacePrefix, p, "overlaps the vxlan driver's link prefix %q: each driver takes every VXLAN link with its prefix as its own", vxlanspec.DefaultInterfacePrefix)
	}
	return nil
}

// PairOptions are a policy's options, split for the two embedded drivers.
type PairOptions struct {
	VXLAN cable.Options
	IPsec cable.Options
}

// ParseOptions validates the per-connection options: vni and mtu go to the VXLAN link, the
// proposals to IKE. ESP proposals must all be AEAD: the MTU is derived for AES-GCM's overhead,
// and a CBC proposal's larger one would have packets dropped that the MTU lets through.
func ParseOptions(o cable.Options) (PairOptions, error) {
	var p PairOptions
	for _, k := range cable.SortedKeys(o) {
		v := o[k]
		switch k {
		case optVNI, optMTU:
			if p.VXLAN == nil {
				p.VXLAN = cable.Options{}
			}
			p.VXLAN[k] = v
		case optIKEProposals, optESPProposals:
			if p.IPsec == nil {
				p.IPsec = cable.Options{}
			}
			p.IPsec[k] = v
			if k == optESPProposals {
				for _, prop := range strings.Split(v, ",") {
					if !isAEAD(strings.TrimSpace(prop)) {
						return PairOptions{}, fmt.Errorf("%s option %s=%q: proposal %q is not AEAD (gcm, ccm, chacha20poly1305): the cable's MTU is derived for AES-GCM's ESP overhead",
							Name, k, v, strings.TrimSpace(prop))
					}
				}
			}
		default:
			return PairOptions{}, fmt.Errorf("%s option %s=%q: unknown key (known: %s, %s, %s, %s)", Name, k, v, optESPProposals, optIKEProposals, optMTU, optVNI)
		}
	}
	if err := cable.ValidateOptions(vxlanspec.Name, p.VXLAN); err != nil {
		return PairOptions{}, fmt.Errorf("%s: %w", Name, err)
	}
	if err := cable.ValidateOptions(ipsecspec.Name, p.IPsec); err != nil {
		return PairOptions{}, fmt.Errorf("%s: %w", Name, err)
	}
	return p, nil
}

// isAEAD reports whether an ESP proposal names a combined-mode cipher only.
func isAEAD(proposal string) bool {
	if proposal == "" {
		return false
	}
	for _, alg := range strings.Split(strings.ToLower(proposal), "-") {
		if strings.Contains(alg, "gcm") || strings.Contains(alg, "ccm") || strings.Contains(alg, "chacha20poly1305") {
			return true
		}
	}
	return false
}

// CheckPublished validates the attributes a remote node published for this driver.
func CheckPublished(attrs map[string]string) error {
	_, err := RemoteVXLANPort(attrs)
	return err
}

// RemoteVXLANPort reads the VXLAN port a remote published.
func RemoteVXLANPort(attrs map[string]string) (uint16, error) {
	v, ok := attrs[AttrVXLANPort]
	if !ok {
		return 0, fmt.Errorf("%s: no %s attribute published", Name, AttrVXLANPort)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > vxlanspec.MaxPinnedPort || strconv.Itoa(n) != v {
		return 0, fmt.Errorf("%s: attribute %s=%q is not a UDP port (1..%d)", Name, AttrVXLANPort, v, vxlanspec.MaxPinnedPort)
	}
	return uint16(n), nil
}
