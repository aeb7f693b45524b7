//go:build bench

package bench

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// The hand-made IPsec tunnel of TestCables: what an operator writes for charon with
// kernel-libipsec on a kernel without ESP, by hand, with the ipsec cable's proposals
// (cable/ipsec's defaults), UDP encapsulation (kernel-libipsec needs it) and the route MTU and
// advmss the cable's charon was given.

const (
	handIKEProposals = "aes256gcm16-prfsha256-x25519"
	handESPProposals = "aes256gcm16-x25519"
)

var routeMTURE = regexp.MustCompile(`\bmtu (?:lock )?(\d+)`)
var routeAdvMSSRE = regexp.MustCompile(`\badvmss (?:lock )?(\d+)`)

// ipsecRouteMTU reads the MTU and advmss of the ipsec cable's route in table 220 of gateway c.
func ipsecRouteMTU(t *testing.T, m *harness.Mesh, c *harness.Cluster) (mtu, advmss int) {
	t.Helper()
	r := harness.NSRun(m.Ctx, c.GwNS, "ip", "route", "show", "table", strconv.Itoa(harness.IPsecTable))
	if r.Err != nil {
		t.Fatalf("ip route show table %d in %s: %s", harness.IPsecTable, c.GwNS, r)
	}
	for _, line := range strings.Split(r.Stdout, "\n") {
		mm, ma := routeMTURE.FindStringSubmatch(line), routeAdvMSSRE.FindStringSubmatch(line)
		if mm != nil && ma != nil {
			mtu, _ = strconv.Atoi(mm[1])
			advmss, _ = strconv.Atoi(ma[1])
			return mtu, advmss
		}
	}
	t.Fatalf("no route with mtu and advmss in table %d of %s:\n%s", harness.IPsecTable, c.GwNS, r.Stdout)
	return 0, 0
}

// handStrongswanConf is the strongswan.conf: the plugins the datapath needs, kernel-libipsec
// before kernel-netlink (the first IPsec backend loaded wins), the routes' MTU and advmss.
func handStrongswanConf(vici string, mtu, advmss int) string {
	return fmt.Sprintf(`charon {
  load = random nonce openssl kdf kernel-libipsec kernel-netlink socket-default vici
  port = %d
  port_nat_t = %d
  install_virtual_ip = no
  filelog {
    stderr {
      default = 1
    }
  }
  syslog {
  }
  plugins {
    vici {
      socket = unix://%s
    }
    kernel-netlink {
      mtu = %d
      mss = %d
    }
  }
}
`, harness.IPsecPort, harness.IPsecNATPort, vici, mtu, advmss)
}

// handSwanctlConf is the swanctl.conf of gateway self (local pods localTS) towards peer.
func handSwanctlConf(self, peer *harness.Cluster, localTS, remoteTS, psk string) string {
	return fmt.Sprintf(`connections {
  hand {
    version = 2
    local_addrs = %s
    remote_addrs = %s
    proposals = %s
    encap = yes
    local {
      auth = psk
      id = %s
    }
    remote {
      auth = psk
      id = %s
    }
    children {
      hand {
        mode = tunnel
        local_ts = %s
        remote_ts = %s
        esp_proposals = %s
      }
    }
  }
}
secrets {
  ike-hand {
    id-self = %s
    id-peer = %s
    secret = 0x%s
  }
}
`, self.GwUnderlay, peer.GwUnderlay, handIKEProposals, self.Name, peer.Name, localTS, remoteTS, handESPProposals,
		self.Name, peer.Name, psk)
}

// handIPsec starts a charon in each of the gateways gws (in a mount namespace with a private
// /run: charon's pid file path is compiled in), loads the hand-written configuration with
// swanctl, initiates from the first and waits until the pods ps ping each other.
//
// With ownSession each charon starts in a session of its own (setsid), as the ipsec driver starts
// its charon (Setsid): with the kernel's scheduler autogroups (kernel.sched_autogroup_enabled=1)
// a session is a scheduling group, so this is the cable's charon's share of a busy machine.
func handIPsec(t *testing.T, m *harness.Mesh, gws []*harness.Cluster, ps []podNS, mtu, advmss int, ownSession bool) {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	psk := hex.EncodeToString(key)
	uris := make([]string, len(gws))
	for i, c := range gws {
		dir := filepath.Join(m.Dir, "charon-"+c.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		vici := filepath.Join(dir, "charon.vici")
		uris[i] = "unix://" + vici
		conf, swanctl := filepath.Join(dir, "strongswan.conf"), filepath.Join(dir, "swanctl.conf")
		for f, content := range map[string]string{
			conf:    handStrongswanConf(vici, mtu, advmss),
			swanctl: handSwanctlConf(c, gws[1-i], ps[i].Prefix.String(), ps[1-i].Prefix.String(), psk),
		} {
			if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		argv := []string{"env", "STRONGSWAN_CONF=" + conf, "unshare", "-m", "sh", "-c",
			`mount -t tmpfs -o mode=0755,size=4m tmpfs /run && exec "$0"`, harness.Charon}
		if ownSession {
			// --wait keeps setsid the parent the harness stops (it forwards nothing, but the
			// namespace's teardown kills what is left).
			argv = append([]string{"setsid", "--wait"}, argv...)
		}
		p, err := harness.StartProcess("charon "+c.Name, c.GwNS, filepath.Join(m.Dir, "charon-"+c.Name+".log"), argv...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		if err := harness.WaitFor(20*time.Second, 100*time.Millisecond, func() (bool, string) {
			r := harness.Run(m.Ctx, "swanctl", "--stats", "--uri", uris[i])
			return r.Err == nil, r.String() + p.LogTail(5)
		}); err != nil {
			t.Fatalf("hand-made charon in %s: %v", c.GwNS, err)
		}
		if r := harness.Run(m.Ctx, "swanctl", "--load-all", "--noprompt", "--file", swanctl, "--uri", uris[i]); r.Err != nil {
			t.Fatalf("swanctl --load-all in %s: %s", c.GwNS, r)
		}
	}
	if r := harness.RunTimeout(m.Ctx, 60*time.Second, "swanctl", "--initiate", "--child", "hand", "--timeout", "30", "--uri", uris[0]); r.Err != nil {
		t.Fatalf("swanctl --initiate: %s", r)
	}
	if err := harness.WaitFor(20*time.Second, 200*time.Millisecond, func() (bool, string) {
		ok, r := m.PingOK(ps[0].NS, ps[1].Addr, 1)
		return ok, r.Output
	}); err != nil {
		t.Fatalf("hand-made IPsec path: %v", err)
	}
}
