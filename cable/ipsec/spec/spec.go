// Package spec is the ipsec cable driver's spec: its name, the settings and options it takes, and
// its traits. It does no I/O and links no strongSwan or netlink code, so the broker and cablectl
// use it without the datapath (cable/ipsec).
package spec

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/cablemesh/cablemesh/cable"
)

// Name is the registry key of this driver.
const Name = "ipsec"

func init() {
	cable.RegisterSpec(cable.Spec{
		Name:            Name,
		ParseSettings:   cable.Check(ParseSettings),
		ValidateOptions: cable.Check(ParseOptions),
		Traits: cable.Traits{
			Label:          "IPsec",
			Handshake:      cable.EstablishedHandshake,
			HandshakeNote:  "IKE uses UDP 500 and 4500",
			Daemon:         "charon",
			OwnsDaemonName: true,
		},
	})
}

// Defaults of the node-level settings (cable.Settings keys in the agent config).
const (
	// DefaultPort is charon's IKE UDP port.
	DefaultPort = 500
	// DefaultNATTPort is charon's NAT-T port: IKE after the switch and UDP-encapsulated ESP.
	DefaultNATTPort = 4500
	// DefaultCharon is where Debian's strongswan-charon installs the daemon.
	DefaultCharon = "/usr/lib/ipsec/charon"
	// MinMTU is the smallest tunnel MTU we accept or compute: the IPv6 minimum.
	MinMTU = 1280
	// MaxMTU is the largest we accept.
	MaxMTU = 65535
	// LibipsecMTU is the MTU of the TUN device kernel-libipsec creates (ipsec0). libipsec reads
	// at most this many bytes per packet from it and strongSwan 5.9 has no setting to change it:
	// a larger packet routed into ipsec0 is dropped without an error, so the route MTU must not
	// exceed it (measured here: a 1401-byte DF packet is lost even with ipsec0 set to 1436).
	LibipsecMTU = 1400
)

// Default proposals. AES-GCM keeps the ESP overhead small (8-byte IV, 4-byte alignment), so a
// 1500-byte underlay carries a 1428-byte inner packet with kernel ESP; X25519 for the key exchange
// (and PFS on CHILD_SA rekeys).
const (
	DefaultIKEProposals = "aes256gcm16-prfsha256-x25519"
	DefaultESPProposals = "aes256gcm16-x25519"
)

// Datapath says where ESP runs.
type Datapath string

const (
	// DatapathAuto probes the kernel: kernel xfrm where it has ESP, libipsec where not.
	DatapathAuto Datapath = "auto"
	// DatapathKernel makes charon install kernel xfrm SAs (plugin kernel-netlink).
	DatapathKernel Datapath = "kernel"
	// DatapathLibipsec runs ESP in charon on the TUN device ipsec0 (plugin kernel-libipsec).
	DatapathLibipsec Datapath = "libipsec"
)

// Setting keys:
//
//	port             charon's IKE port, published to remote ends (500)
//	nattPort         charon's NAT-T port, for IKE after the switch and ESP in UDP (4500)
//	useSystemCharon  the VICI socket of a charon the driver uses instead of starting its own;
//	                 empty or unset: its own. Excludes port, nattPort, charon and datapath.
//	mtu              MTU of the tunnel routes; 0 or unset: derived from the underlay and datapath
//	charon           the charon binary to start (/usr/lib/ipsec/charon)
//	datapath         where ESP runs: auto, kernel or libipsec (auto)
const (
	KeyPort            = "port"
	KeyNATTPort        = "nattPort"
	KeyUseSystemCharon = "useSystemCharon"
	KeyMTU             = "mtu"
	KeyCharon          = "charon"
	KeyDatapath        = "datapath"
)

// Option keys (per connection, from the policy's cableDriver.options).
const (
	OptIKEProposals = "ikeProposals"
	OptESPProposals = "espProposals"
	OptEncap        = "encap"
)

// Config is the validated form of cable.Settings.
type Config struct {
	// Port, NATTPort, Charon and Datapath are those of our own charon: zero with a system one.
	Port     int
	NATTPort int
	// SystemVICI is the vici socket path of a charon the driver does not own; "" means the
	// driver starts and supervises its own.
	SystemVICI string
	// MTU is 0 when not set: Init derives it from the underlay and the datapath.
	MTU      int
	Charon   string
	Datapath Datapath
}

// Options is the validated form of cable.Options.
type Options struct {
	IKEProposals []string
	ESPProposals []string
	Encap        bool
}

// ParseSettings validates settings and fills defaults. It does no I/O; every error is a
// *cable.SettingError naming the key and the value. With useSystemCharon the keys that shape
// only a charon of our own (port, nattPort, charon, datapath) are refused, and they get no
// defaults: the system charon has its own configuration.
func ParseSettings(s cable.Settings) (Config, error) {
	var c Config
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case KeyPort:
			c.Port, err = cable.PortSetting(Name, k, v)
		case KeyNATTPort:
			c.NATTPort, err = cable.PortSetting(Name, k, v)
		case KeyUseSystemCharon:
			// Empty is unset: the driver runs its own charon.
			if v != "" {
				if !filepath.IsAbs(v) {
					err = cable.BadSetting(Name, k, v, "is not an absolute path (the system charon's VICI socket, e.g. /var/run/charon.vici)")
				}
				c.SystemVICI = filepath.Clean(v)
			}
		case KeyMTU:
			c.MTU, err = cable.MTUSetting(Name, k, v, MinMTU, MaxMTU)
		case KeyCharon:
			if !filepath.IsAbs(v) {
				err = cable.BadSetting(Name, k, v, "is not an absolute path")
			}
			c.Charon = filepath.Clean(v)
		case KeyDatapath:
			switch d := Datapath(v); d {
			case DatapathAuto, DatapathKernel, DatapathLibipsec:
				c.Datapath = d
			default:
				err = cable.BadSetting(Name, k, v, "is not %s, %s or %s", DatapathAuto, DatapathKernel, DatapathLibipsec)
			}
		default:
			err = cable.UnknownSetting(Name, k, v, KeyPort, KeyNATTPort, KeyUseSystemCharon, KeyMTU, KeyCharon, KeyDatapath)
		}
		if err != nil {
			return Config{}, err
		}
	}
	if c.SystemVICI != "" {
		for _, k := range []string{KeyPort, KeyNATTPort, KeyCharon, KeyDatapath} {
			if _, ok := s[k]; ok {
				return Config{}, &cable.SettingError{Driver: Name, Key: k, NoValue: true,
					Reason: fmt.Sprintf("must be unset with %s.%s (the system charon has its own configuration)", Name, KeyUseSystemCharon)}
			}
		}
		return c, nil
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.NATTPort == 0 {
		c.NATTPort = DefaultNATTPort
	}
	if c.Charon == "" {
		c.Charon = DefaultCharon
	}
	if c.Datapath == "" {
		c.Datapath = DatapathAuto
	}
	if c.Port == c.NATTPort {
		return Config{}, cable.BadSetting(Name, KeyNATTPort, strconv.Itoa(c.NATTPort), "equals %s.%s; charon needs two different ports", Name, KeyPort)
	}
	return c, nil
}

// ParseOptions validates the per-connection options of a policy.
func ParseOptions(o cable.Options) (Options, error) {
	opts := Options{
		IKEProposals: []string{DefaultIKEProposals},
		ESPProposals: []string{DefaultESPProposals},
		Encap:        true,
	}
	for _, k := range cable.SortedKeys(o) {
		v := o[k]
		switch k {
		case OptIKEProposals, OptESPProposals:
			list, err := parseProposals(v)
			if err != nil {
				return Options{}, fmt.Errorf("ipsec option %s=%q: %w", k, v, err)
			}
			if k == OptIKEProposals {
				opts.IKEProposals = list
			} else {
				opts.ESPProposals = list
			}
		case OptEncap:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return Options{}, fmt.Errorf("ipsec option %s=%q: want true or false", k, v)
			}
			opts.Encap = b
		default:
			return Options{}, fmt.Errorf("ipsec option %s=%q: unknown key (known: %s, %s, %s)", k, v, OptIKEProposals, OptESPProposals, OptEncap)
		}
	}
	return opts, nil
}

// parseProposals splits a comma-separated list of strongSwan proposals such as
// "aes256gcm16-prfsha256-x25519,aes128-sha256-modp2048". charon itself judges the algorithms; we
// only refuse what cannot be one (empty entries, characters outside the proposal syntax), so a
// typo fails here, naming the value, rather than as a vague load-conn error.
func parseProposals(v string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(v, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("empty proposal in the list")
		}
		for _, r := range p {
			if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_') {
				return nil, fmt.Errorf("proposal %q has the invalid character %q", p, r)
			}
		}
		out = append(out, strings.ToLower(p))
	}
	return out, nil
}
