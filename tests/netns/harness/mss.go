package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/cablemesh/cablemesh/cable/mss"
)

// MSSPort is where AcceptedMSS's one-connection server listens.
const MSSPort = 7001

// MSSClamp reads the TCP MSS clamp in namespace ns from the kernel (nftables table inet
// cablemesh), not from the agent: for each chain, the links its rules match on oifname, named as
// the drivers name their links: an exact name ("wg-east"), or a prefix followed by '*'
// ("cbl-vx*"). ok is false when the table does not exist.
func MSSClamp(ns string) (chains map[string][]string, ok bool, err error) {
	f, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return nil, false, fmt.Errorf("nftables in %s: %w", ns, err)
	}
	if _, err := c.ListTableOfFamily(mss.TableName, nftables.TableFamilyINet); err != nil {
		return nil, false, nil
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, false, fmt.Errorf("list chains in %s: %w", ns, err)
	}
	chains = map[string][]string{}
	for _, ch := range all {
		if ch.Table == nil || ch.Table.Name != mss.TableName {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, false, fmt.Errorf("rules of %s/%s in %s: %w", mss.TableName, ch.Name, ns, err)
		}
		chains[ch.Name] = []string{}
		for _, r := range rules {
			if l, ok := oifnameMatch(r.Exprs); ok {
				chains[ch.Name] = append(chains[ch.Name], l)
			}
		}
	}
	return chains, true, nil
}

// oifnameMatch finds `oifname X` in a rule: a meta oifname load compared for equality. The kernel
// compares as many bytes as the rule holds: a NUL-terminated name matches that name only, bare
// bytes match every name they start.
func oifnameMatch(exprs []expr.Any) (string, bool) {
	for i := 0; i+1 < len(exprs); i++ {
		m, ok := exprs[i].(*expr.Meta)
		if !ok || m.Key != expr.MetaKeyOIFNAME {
			continue
		}
		cmp, ok := exprs[i+1].(*expr.Cmp)
		if !ok || cmp.Op != expr.CmpOpEq {
			continue
		}
		if name, _, exact := bytes.Cut(cmp.Data, []byte{0}); exact {
			return string(name), true
		}
		return string(cmp.Data) + "*", true
	}
	return "", false
}

// CoversLink reports whether one of links (an exact name, or a prefix followed by '*') matches the
// interface name.
func CoversLink(links []string, name string) bool {
	for _, l := range links {
		if prefix, ok := strings.CutSuffix(l, "*"); ok && strings.HasPrefix(name, prefix) || l == name {
			return true
		}
	}
	return false
}

// AcceptedMSS opens one TCP connection from namespace clientNS to server:MSSPort in serverNS and
// returns TCP_MAXSEG of the server's accepted socket: what the client's SYN advertised as it
// arrived, after any clamping on the way, less TCP options.
func (m *Mesh) AcceptedMSS(clientNS, serverNS string, server netip.Addr) (int, error) {
	m.T.Helper()
	addr := netip.AddrPortFrom(server, MSSPort).String()
	// A log of its own per call: Process.Log reads the whole file, and a second call on one
	// namespace would otherwise find the first call's "listening" and result lines.
	p, err := StartProcess("tcpcheck-accept "+serverNS, serverNS, filepath.Join(m.Dir, fmt.Sprintf("tcpaccept-%s-%d.log", serverNS, time.Now().UnixNano())),
		m.Bin.TCPCheck, "accept", "-listen", addr, "-timeout", "20s")
	if err != nil {
		return 0, err
	}
	m.track(p)
	defer p.Stop(5 * time.Second)
	if err := WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(p.Log(), "listening"), p.Log()
	}); err != nil {
		return 0, fmt.Errorf("server in %s: %w", serverNS, err)
	}
	if r := NSRun(m.Ctx, clientNS, m.Bin.TCPCheck, "dial", "-addr", addr, "-timeout", "5s"); r.Err != nil {
		return 0, fmt.Errorf("dial from %s: %s", clientNS, r)
	}
	var res struct {
		MSS  int    `json:"mss"`
		Peer string `json:"peer"`
	}
	err = WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		for _, l := range strings.Split(p.Log(), "\n") {
			if strings.HasPrefix(l, "{") && json.Unmarshal([]byte(l), &res) == nil {
				return true, ""
			}
		}
		return false, p.Log()
	})
	return res.MSS, err
}

// RouteMTU is the MTU of the path namespace ns takes to dst: the route's mtu, else its link's;
// dev is the link.
func (m *Mesh) RouteMTU(ns string, dst netip.Addr) (dev string, mtu int, err error) {
	r := Run(m.Ctx, "ip", "-n", ns, "-j", "-d", "route", "get", dst.String())
	if r.Err != nil {
		return "", 0, fmt.Errorf("%s", r)
	}
	var routes []struct {
		Dev     string           `json:"dev"`
		Metrics []map[string]any `json:"metrics"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &routes); err != nil || len(routes) != 1 {
		return "", 0, fmt.Errorf("decode `ip route get %s` in %s: %v: %q", dst, ns, err, r.Stdout)
	}
	dev = routes[0].Dev
	for _, mt := range routes[0].Metrics {
		if v, ok := mt["mtu"].(float64); ok {
			return dev, int(v), nil
		}
	}
	l := Run(m.Ctx, "ip", "-n", ns, "-j", "link", "show", "dev", dev)
	var links []struct {
		MTU int `json:"mtu"`
	}
	if err := json.Unmarshal([]byte(l.Stdout), &links); err != nil || len(links) != 1 {
		return dev, 0, fmt.Errorf("decode `ip link show %s` in %s: %v: %q", dev, ns, err, l.Stdout)
	}
	return dev, links[0].MTU, nil
}
