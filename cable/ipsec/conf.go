package ipsec

import (
	"fmt"
	"strings"
)

// confParams shape the strongswan.conf of a charon the driver owns.
type confParams struct {
	Port       int
	NATTPort   int
	ViciSocket string // absolute path
	Libipsec   bool
	MTU        int
	MSS        int
	// NoRoutes turns charon's install_routes off: a charon of transport-mode connections
	// (NewEmbedded) needs no routes, and must not add the rule to table 220 the ipsec driver's
	// charon owns.
	NoRoutes bool
}

// renderConf is the strongswan.conf of our own charon. It loads an explicit, minimal plugin list
// (so nothing from /etc/strongswan.d applies): random and nonce for nonces, openssl for every
// cipher, hash, PRF and DH group, kdf for IKEv2's prf+, kernel-netlink for addresses, routes and
// (without libipsec) the xfrm SAs, socket-default for IKE, vici for us. kernel-libipsec is listed
// before kernel-netlink when enabled: the first loaded IPsec backend wins, and otherwise the SAs
// would go to the kernel, which has no ESP here.
func renderConf(p confParams) string {
	plugins := "random nonce openssl kdf kernel-netlink socket-default vici"
	if p.Libipsec {
		plugins = "random nonce openssl kdf kernel-libipsec kernel-netlink socket-default vici"
	}
	routes, table := "yes", ""
	if p.NoRoutes {
		// routing_table = 0 also keeps charon from adding (and, stopping, deleting) the rule
		// "from all lookup 220", which is the ipsec driver's charon's when both run.
		routes, table = "no", "\n      routing_table = 0"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by the cablemesh ipsec cable driver; rewritten at every start.
charon {
  load = %s
  port = %d
  port_nat_t = %d
  # Routes for every CHILD_SA go into table 220 (rule priority 220), via ipsec0 with libipsec,
  # with a source address inside the local traffic selector when the node has one.
  install_routes = %s
  install_virtual_ip = no
  # Give up on a silent peer within about 35s (2 + 3 + 4.5 + 6.75 + 10.1 + ...), not 165s.
  retransmit_tries = 4
  retransmit_timeout = 2.0
  retransmit_base = 1.5
  filelog {
    stderr {
      # Level 1 never prints key material (strongSwan keeps that for level 4).
      default = 1
      net = 0
      enc = 0
      asn = 0
      job = 0
      time = no
    }
  }
  syslog {
    # An empty section: nothing goes to the host's syslog.
  }
  plugins {
    vici {
      socket = unix://%s
    }
    kernel-netlink {
      mtu = %d
      mss = %d%s
    }
  }
}
`, plugins, p.Port, p.NATTPort, routes, p.ViciSocket, p.MTU, p.MSS, table)
	return b.String()
}
