package vxlanipsec

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/cable/vxlan"
)

// Defaults of the node-level settings (the agent config's `vxlan+ipsec:` block). The ports differ
// from the vxlan and ipsec drivers' so that all three run side by side on one gateway: another
// VXLAN port keeps the transport-mode selectors off the plain vxlan cable's traffic, other IKE
// ports let this driver's charon run beside the ipsec driver's.
const (
	DefaultVXLANPort       = 4799
	DefaultVNI             = vxlan.DefaultVNI
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
const Overhead = vxlan.Overhead + ESPTransportOverhead

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
	keyIKEPort         = "ikePort"
	keyNATTPort        = "nattPort"
	keyCharon          = "charon"
)

var settingKeys = []string{keyVXLANPort, keyVNI, keyMTU, keyInterfacePrefix, keyIKEPort, keyNATTPort, keyCharon}

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

// config is the validated settings, split into the two embedded drivers' own settings.
type config struct {
	VXLANPort int
	VXLAN     cable.Settings // for vxlan.NewEmbedded
	IPsec     cable.Settings // for ipsec.NewEmbedded
}

// parseSettings validates the block and fills defaults, without I/O. Every error is a
// *cable.SettingError of this driver ("vxlan+ipsec.<key>: <value> <reason>"), also those the
// embedded drivers' own rules find, so the operator reads the key they wrote.
func parseSettings(s cable.Settings) (config, error) {
	c := config{
		VXLANPort: DefaultVXLANPort,
		VXLAN:     cable.Settings{"port": strconv.Itoa(DefaultVXLANPort), "vni": strconv.Itoa(DefaultVNI), "interfacePrefix": DefaultInterfacePrefix},
		IPsec:     cable.Settings{"port": strconv.Itoa(DefaultIKEPort), "nattPort": strconv.Itoa(DefaultNATTPort), "datapath": string(ipsec.DatapathKernel)},
	}
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case keyVXLANPort:
			// The kernel's source port range ends one above the port (vxlan.MaxPinnedPort).
			c.VXLANPort, err = cable.IntSetting(Name, k, v, 1, vxlan.MaxPinnedPort)
			c.VXLAN["port"] = v
		case keyVNI:
			_, err = cable.IntSetting(Name, k, v, 1, vxlan.MaxVNI)
			c.VXLAN["vni"] = v
		case keyMTU:
			_, err = cable.MTUSetting(Name, k, v, vxlan.MinMTU, vxlan.MaxMTU)
			c.VXLAN["mtu"] = v
		case keyInterfacePrefix:
			err = checkPrefix(v)
			c.VXLAN["interfacePrefix"] = v
		case keyIKEPort:
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
			return config{}, err
		}
	}
	if c.IPsec["port"] == c.IPsec["nattPort"] {
		return config{}, cable.BadSetting(Name, keyNATTPort, c.IPsec["nattPort"], "equals %s.%s; charon needs two different ports", Name, keyIKEPort)
	}
	if c.IPsec["port"] == strconv.Itoa(c.VXLANPort) || c.IPsec["nattPort"] == strconv.Itoa(c.VXLANPort) {
		return config{}, cable.BadSetting(Name, keyVXLANPort, strconv.Itoa(c.VXLANPort), "is also an IKE port of %s; VXLAN and IKE need different ports", Name)
	}
	// The embedded drivers' own rules, reported under this driver's name and keys.
	if err := cable.ParseSettings(vxlan.Name, c.VXLAN); err != nil {
		return config{}, rename(err, map[string]string{"port": keyVXLANPort})
	}
	if err := cable.ParseSettings(ipsec.Name, c.IPsec); err != nil {
		return config{}, rename(err, map[string]string{"port": keyIKEPort})
	}
	return c, nil
}

// rename turns an embedded driver's SettingError into this driver's, with our key names.
func rename(err error, keys map[string]string) error {
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
	if strings.HasPrefix(p, vxlan.DefaultInterfacePrefix) || strings.HasPrefix(vxlan.DefaultInterfacePrefix, p) {
		return cable.BadSetting(Name, keyInterfacePrefix, p, "overlaps the vxlan driver's link prefix %q: each driver takes every VXLAN link with its prefix as its own", vxlan.DefaultInterfacePrefix)
	}
	return nil
}

// pairOptions are a policy's options, split for the two embedded drivers.
type pairOptions struct {
	VXLAN cable.Options
	IPsec cable.Options
}

// parseOptions validates the per-connection options: vni and mtu go to the VXLAN link, the
// proposals to IKE. ESP proposals must all be AEAD: the MTU is derived for AES-GCM's overhead,
// and a CBC proposal's larger one would have packets dropped that the MTU lets through.
func parseOptions(o cable.Options) (pairOptions, error) {
	var p pairOptions
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
						return pairOptions{}, fmt.Errorf("%s option %s=%q: proposal %q is not AEAD (gcm, ccm, chacha20poly1305): the cable's MTU is derived for AES-GCM's ESP overhead",
							Name, k, v, strings.TrimSpace(prop))
					}
				}
			}
		default:
			return pairOptions{}, fmt.Errorf("%s option %s=%q: unknown key (known: %s, %s, %s, %s)", Name, k, v, optESPProposals, optIKEProposals, optMTU, optVNI)
		}
	}
	if err := cable.ValidateOptions(vxlan.Name, p.VXLAN); err != nil {
		return pairOptions{}, fmt.Errorf("%s: %w", Name, err)
	}
	if err := cable.ValidateOptions(ipsec.Name, p.IPsec); err != nil {
		return pairOptions{}, fmt.Errorf("%s: %w", Name, err)
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

// checkPublished validates the attributes a remote node published for this driver.
func checkPublished(attrs map[string]string) error {
	_, err := remoteVXLANPort(attrs)
	return err
}

// remoteVXLANPort reads the VXLAN port a remote published.
func remoteVXLANPort(attrs map[string]string) (uint16, error) {
	v, ok := attrs[AttrVXLANPort]
	if !ok {
		return 0, fmt.Errorf("%s: no %s attribute published", Name, AttrVXLANPort)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > vxlan.MaxPinnedPort || strconv.Itoa(n) != v {
		return 0, fmt.Errorf("%s: attribute %s=%q is not a UDP port (1..%d)", Name, AttrVXLANPort, v, vxlan.MaxPinnedPort)
	}
	return uint16(n), nil
}
