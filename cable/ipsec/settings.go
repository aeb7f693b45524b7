package ipsec

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/cablemesh/cablemesh/cable"
)

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
	// fallbackUnderlayMTU is assumed when the link holding the advertise address cannot be found.
	fallbackUnderlayMTU = 1500
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

// Setting keys.
const (
	keyPort            = "port"
	keyNATTPort        = "nattPort"
	keyUseSystemCharon = "useSystemCharon"
	keyMTU             = "mtu"
	keyCharon          = "charon"
	keyDatapath        = "datapath"
)

// Option keys (per connection, from the policy's cableDriver.options).
const (
	optIKEProposals = "ikeProposals"
	optESPProposals = "espProposals"
	optEncap        = "encap"
)

// config is the validated form of cable.Settings.
type config struct {
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

// options is the validated form of cable.Options.
type options struct {
	IKEProposals []string
	ESPProposals []string
	Encap        bool
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// parseSettings validates settings and fills defaults. It does no I/O; every error names the key
// and the value.
func parseSettings(s cable.Settings) (config, error) {
	c := config{Port: DefaultPort, NATTPort: DefaultNATTPort, Charon: DefaultCharon, Datapath: DatapathAuto}
	for _, k := range sortedKeys(s) {
		v := s[k]
		switch k {
		case keyPort, keyNATTPort:
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 || p > 65535 {
				return config{}, fmt.Errorf("ipsec setting %s=%q: want a UDP port 1..65535", k, v)
			}
			if k == keyPort {
				c.Port = p
			} else {
				c.NATTPort = p
			}
		case keyUseSystemCharon:
			if v == "" || !filepath.IsAbs(v) {
				return config{}, fmt.Errorf("ipsec setting %s=%q: want the absolute path of the system charon's vici socket, e.g. /var/run/charon.vici", k, v)
			}
			c.SystemVICI = filepath.Clean(v)
		case keyMTU:
			m, err := strconv.Atoi(v)
			if err != nil || m < MinMTU || m > MaxMTU {
				return config{}, fmt.Errorf("ipsec setting %s=%q: want an integer %d..%d", k, v, MinMTU, MaxMTU)
			}
			c.MTU = m
		case keyCharon:
			if v == "" || !filepath.IsAbs(v) {
				return config{}, fmt.Errorf("ipsec setting %s=%q: want the absolute path of the charon binary", k, v)
			}
			c.Charon = filepath.Clean(v)
		case keyDatapath:
			switch d := Datapath(v); d {
			case DatapathAuto, DatapathKernel, DatapathLibipsec:
				c.Datapath = d
			default:
				return config{}, fmt.Errorf("ipsec setting %s=%q: want %s, %s or %s", k, v, DatapathAuto, DatapathKernel, DatapathLibipsec)
			}
		default:
			return config{}, fmt.Errorf("ipsec setting %s=%q: unknown key (known: %s, %s, %s, %s, %s, %s)",
				k, v, keyPort, keyNATTPort, keyUseSystemCharon, keyMTU, keyCharon, keyDatapath)
		}
	}
	if c.Port == c.NATTPort {
		return config{}, fmt.Errorf("ipsec setting %s=%d equals %s=%d: charon needs two different ports", keyPort, c.Port, keyNATTPort, c.NATTPort)
	}
	if c.SystemVICI != "" {
		// The system charon has its own ports, plugins and binary; settings that only shape our
		// own charon would be silently ignored.
		for _, k := range []string{keyPort, keyNATTPort, keyCharon, keyDatapath} {
			if v, ok := s[k]; ok {
				return config{}, fmt.Errorf("ipsec setting %s=%q: not applicable with %s=%q (the system charon has its own configuration)", k, v, keyUseSystemCharon, c.SystemVICI)
			}
		}
	}
	return c, nil
}

// parseOptions validates the per-connection options of a policy.
func parseOptions(o cable.Options) (options, error) {
	opts := options{
		IKEProposals: []string{DefaultIKEProposals},
		ESPProposals: []string{DefaultESPProposals},
		Encap:        true,
	}
	for _, k := range sortedKeys(o) {
		v := o[k]
		switch k {
		case optIKEProposals, optESPProposals:
			list, err := parseProposals(v)
			if err != nil {
				return options{}, fmt.Errorf("ipsec option %s=%q: %w", k, v, err)
			}
			if k == optIKEProposals {
				opts.IKEProposals = list
			} else {
				opts.ESPProposals = list
			}
		case optEncap:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return options{}, fmt.Errorf("ipsec option %s=%q: want true or false", k, v)
			}
			opts.Encap = b
		default:
			return options{}, fmt.Errorf("ipsec option %s=%q: unknown key (known: %s, %s, %s)", k, v, optIKEProposals, optESPProposals, optEncap)
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
