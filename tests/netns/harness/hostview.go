package harness

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// HostView is what a gateway's network namespace holds of the cables, read from the host with
// ip, bridge, swanctl and the WireGuard UAPI, never from the agent's own account of it.
type HostView struct {
	NS string
	// WGInterface is the gateway's WireGuard link name.
	WGInterface string
	// Links by name: kind ("wireguard", "tun", "vxlan", ...) and, for vxlan, the VNI.
	Links map[string]LinkInfo
	// Routes of every table with protocol 157 (wireguard, vxlan) and of table 220 (ipsec).
	Routes []RouteInfo
	// FDB entries of the VXLAN links: link name -> remote underlay addresses (dst).
	FDB map[string][]string
	// WGPeers are the WireGuard device's peers; WGRead says whether they could be read at all
	// (WGError says why not).
	WGPeers []WGPeer
	WGRead  bool
	WGError string
	// SAs is `swanctl --list-sas` of the agent's charon ("" when it has no vici socket).
	SAs      string
	SAsError string
}

// LinkInfo is one link of `ip -d -j link show`.
type LinkInfo struct {
	Name string
	Kind string
	VNI  int
	MTU  int
}

// RouteInfo is one route of `ip -j route show table all`.
type RouteInfo struct {
	Dst      string
	Dev      string
	Gateway  string
	Table    string
	Protocol string
	Raw      string
}

// WGPeer is one WireGuard peer as the device reports it over its UAPI.
type WGPeer struct {
	PublicKey     string // hex
	Endpoint      string
	AllowedIPs    []string
	LastHandshake time.Time
	RxBytes       uint64
	TxBytes       uint64
}

// Evidence is what the host shows of one remote cluster's cable(s) on one gateway.
type Evidence struct {
	WGPeer     bool // a WireGuard peer with the remote's endpoint or its pod CIDR allowed
	WGRoute    bool // a route to the remote pod CIDR over the WireGuard device
	VXLANFDB   bool // an FDB entry towards the remote gateway on a cbl-vx link
	VXLANRoute bool // a route to the remote pod CIDR over a cbl-vx link
	VXLANLink  string
	VXLANVNI   int
	IPsecSA    bool // an ESTABLISHED IKE_SA with an INSTALLED CHILD_SA named cbl-<remote>
	IPsecRoute bool // a route to the remote pod CIDR in table 220
}

// Drivers lists the drivers with any trace of the pair on the host, sorted.
func (e Evidence) Drivers() []string {
	var d []string
	if e.WGPeer || e.WGRoute {
		d = append(d, DriverWireGuard)
	}
	if e.VXLANFDB || e.VXLANRoute {
		d = append(d, DriverVXLAN)
	}
	if e.IPsecSA || e.IPsecRoute {
		d = append(d, DriverIPsec)
	}
	sort.Strings(d)
	return d
}

// Complete reports whether every trace driver d leaves for a working pair is there (a peer and
// a route; an FDB entry and a route; an SA and a route). wgKnown false skips the peer (when the
// device's peers cannot be read).
func (e Evidence) Complete(d string, wgKnown bool) bool {
	switch d {
	case DriverWireGuard:
		return e.WGRoute && (e.WGPeer || !wgKnown)
	case DriverVXLAN:
		return e.VXLANFDB && e.VXLANRoute
	case DriverIPsec:
		return e.IPsecSA && e.IPsecRoute
	}
	return false
}

func (e Evidence) String() string {
	return fmt.Sprintf("wg{peer %t route %t} vxlan{fdb %t route %t link %q vni %d} ipsec{sa %t route %t}",
		e.WGPeer, e.WGRoute, e.VXLANFDB, e.VXLANRoute, e.VXLANLink, e.VXLANVNI, e.IPsecSA, e.IPsecRoute)
}

// For extracts the evidence of the cable(s) to remote.
func (h HostView) For(remote *Cluster) Evidence {
	var e Evidence
	pod := remote.PodCIDR.Masked().String()
	under := remote.GwUnderlay.String()
	for _, p := range h.WGPeers {
		if host, _, err := net.SplitHostPort(p.Endpoint); err == nil && host == under {
			e.WGPeer = true
		}
		for _, a := range p.AllowedIPs {
			if a == pod {
				e.WGPeer = true
			}
		}
	}
	for _, r := range h.Routes {
		if r.Dst != pod {
			continue
		}
		switch {
		case r.Table == strconv.Itoa(IPsecTable):
			e.IPsecRoute = true
		case r.Dev == h.WGInterface:
			e.WGRoute = true
		case strings.HasPrefix(r.Dev, VXLANLinkPrefix):
			e.VXLANRoute = true
			e.VXLANLink = r.Dev
			e.VXLANVNI = h.Links[r.Dev].VNI
		}
	}
	for link, dsts := range h.FDB {
		for _, d := range dsts {
			if d == under {
				e.VXLANFDB = true
				if e.VXLANLink == "" {
					e.VXLANLink = link
					e.VXLANVNI = h.Links[link].VNI
				}
			}
		}
	}
	sa := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta("cbl-"+remote.Name) + `: #\d+,.*ESTABLISHED`)
	child := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta("cbl-"+remote.Name) + `: #\d+,.*INSTALLED`)
	e.IPsecSA = sa.MatchString(h.SAs) && child.MatchString(h.SAs)
	return e
}

// Host reads the gateway namespace's cables from the host.
func (c *Cluster) Host() HostView {
	m := c.m
	h := HostView{NS: c.GwNS, WGInterface: c.WGInterface, Links: map[string]LinkInfo{}, FDB: map[string][]string{}}

	var links []struct {
		Name     string `json:"ifname"`
		MTU      int    `json:"mtu"`
		LinkInfo struct {
			Kind string `json:"info_kind"`
			Data struct {
				ID int `json:"id"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	if r := Run(m.Ctx, "ip", "-n", c.GwNS, "-d", "-j", "link", "show"); r.Err == nil {
		_ = json.Unmarshal([]byte(r.Stdout), &links)
	}
	for _, l := range links {
		h.Links[l.Name] = LinkInfo{Name: l.Name, Kind: l.LinkInfo.Kind, VNI: l.LinkInfo.Data.ID, MTU: l.MTU}
	}

	for _, args := range [][]string{{"table", "all", "proto", strconv.Itoa(RouteProtocol)}, {"table", strconv.Itoa(IPsecTable)}} {
		r := Run(m.Ctx, "ip", append([]string{"-n", c.GwNS, "-j", "route", "show"}, args...)...)
		if r.Err != nil {
			continue
		}
		var routes []map[string]any
		_ = json.Unmarshal([]byte(r.Stdout), &routes)
		for _, rt := range routes {
			ri := RouteInfo{Dst: str(rt["dst"]), Dev: str(rt["dev"]), Gateway: str(rt["gateway"]), Table: str(rt["table"]), Protocol: str(rt["protocol"])}
			if ri.Table == "" {
				ri.Table = "main"
			}
			if args[0] == "table" && args[1] == strconv.Itoa(IPsecTable) {
				ri.Table = strconv.Itoa(IPsecTable)
			}
			raw, _ := json.Marshal(rt)
			ri.Raw = string(raw)
			h.Routes = append(h.Routes, ri)
		}
	}

	for name, l := range h.Links {
		if l.Kind != "vxlan" {
			continue
		}
		r := Run(m.Ctx, "bridge", "-n", c.GwNS, "-j", "fdb", "show", "dev", name)
		var fdb []struct {
			Dst string `json:"dst"`
		}
		_ = json.Unmarshal([]byte(r.Stdout), &fdb)
		for _, f := range fdb {
			if f.Dst != "" {
				h.FDB[name] = append(h.FDB[name], f.Dst)
			}
		}
	}

	h.WGPeers, h.WGError = c.wgPeers()
	h.WGRead = h.WGError == ""

	sock := filepath.Join(c.StateDir, "ipsec", "charon.vici")
	if _, err := os.Stat(sock); err == nil {
		r := NSRun(m.Ctx, c.GwNS, "swanctl", "--list-sas", "--uri", "unix://"+sock)
		h.SAs = r.Stdout
		if r.Err != nil {
			h.SAsError = r.String()
		}
	}
	return h
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// wgPeers reads the WireGuard device's peers. The kernel here has no WireGuard, so the agent
// runs wireguard-go in a private mount namespace (cable/wireguard RunIsolated) where its UAPI
// socket lives at /run/wireguard/<iface>.sock; the host reaches it through
// /proc/<pid>/root of a process in that mount namespace. A kernel device is read with `wg`.
func (c *Cluster) wgPeers() ([]WGPeer, string) {
	m := c.m
	if _, err := os.Stat("/sys/module/wireguard"); err == nil {
		r := NSRun(m.Ctx, c.GwNS, "wg", "show", c.WGInterface, "dump")
		if r.Err != nil {
			return nil, r.String()
		}
		return parseWGDump(r.Stdout), ""
	}
	out := Run(m.Ctx, "ip", "netns", "pids", c.GwNS).Stdout
	var tried []string
	for _, s := range strings.Fields(out) {
		for _, dir := range []string{"run/wireguard", "var/run/wireguard"} {
			p := filepath.Join("/proc", s, "root", dir, c.WGInterface+".sock")
			if _, err := os.Stat(p); err != nil {
				continue
			}
			peers, err := uapiGet(p)
			if err == nil {
				return peers, ""
			}
			tried = append(tried, fmt.Sprintf("%s: %v", p, err))
		}
	}
	if len(tried) == 0 {
		return nil, fmt.Sprintf("no process in %s has a UAPI socket for %s", c.GwNS, c.WGInterface)
	}
	return nil, strings.Join(tried, "; ")
}

// uapiGet asks a userspace WireGuard device for its configuration ("get=1") over its UAPI
// socket (https://www.wireguard.com/xplatform/) and parses the peers.
func uapiGet(path string) ([]WGPeer, error) {
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := conn.Write([]byte("get=1\n\n")); err != nil {
		return nil, err
	}
	var peers []WGPeer
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "errno":
			if v != "0" {
				return nil, fmt.Errorf("uapi get: errno=%s", v)
			}
		case "public_key":
			b, _ := hex.DecodeString(v)
			peers = append(peers, WGPeer{PublicKey: hex.EncodeToString(b)})
		}
		if len(peers) == 0 {
			continue
		}
		p := &peers[len(peers)-1]
		switch k {
		case "endpoint":
			p.Endpoint = v
		case "allowed_ip":
			p.AllowedIPs = append(p.AllowedIPs, normalizePrefix(v))
		case "last_handshake_time_sec":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
				p.LastHandshake = time.Unix(n, 0)
			}
		case "rx_bytes":
			p.RxBytes, _ = strconv.ParseUint(v, 10, 64)
		case "tx_bytes":
			p.TxBytes, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	return peers, sc.Err()
}

// parseWGDump reads `wg show IFACE dump` (first line: the interface; then one line per peer:
// public-key preshared-key endpoint allowed-ips latest-handshake rx tx keepalive).
func parseWGDump(out string) []WGPeer {
	var peers []WGPeer
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines[min(1, len(lines)):] {
		f := strings.Split(l, "\t")
		if len(f) < 7 {
			continue
		}
		p := WGPeer{PublicKey: f[0], Endpoint: f[2]}
		for _, a := range strings.Split(f[3], ",") {
			if a != "(none)" && a != "" {
				p.AllowedIPs = append(p.AllowedIPs, normalizePrefix(a))
			}
		}
		if n, _ := strconv.ParseInt(f[4], 10, 64); n > 0 {
			p.LastHandshake = time.Unix(n, 0)
		}
		p.RxBytes, _ = strconv.ParseUint(f[5], 10, 64)
		p.TxBytes, _ = strconv.ParseUint(f[6], 10, 64)
		peers = append(peers, p)
	}
	return peers
}

func normalizePrefix(s string) string {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked().String()
	}
	return s
}

// CheckPair compares what the host shows of c's cable(s) to remote with want: a connect pair
// has the complete traces of want.Driver and none of any other driver; a no-connect pair has
// none at all. It returns the problems found (none when all is as wanted).
func CheckPair(h HostView, remote *Cluster, want Want) (Evidence, []string) {
	e := h.For(remote)
	var problems []string
	have := e.Drivers()
	if want.Connect {
		if !e.Complete(want.Driver, h.WGRead) {
			problems = append(problems, fmt.Sprintf("%s -> %s: want a complete %s cable on the host, have %s", h.NS, remote.Name, want.Driver, e))
		}
		// The link the pair's routes use is of the driver's kind: WireGuard's link a
		// wireguard device (kernel) or a TUN (wireguard-go); the VXLAN link a vxlan device
		// with the mesh's VNI.
		switch want.Driver {
		case DriverWireGuard:
			if k := h.Links[h.WGInterface].Kind; k != "wireguard" && k != "tun" {
				problems = append(problems, fmt.Sprintf("%s: link %s is of kind %q, want wireguard or tun", h.NS, h.WGInterface, k))
			}
		case DriverVXLAN:
			if l := h.Links[e.VXLANLink]; l.Kind != "vxlan" || l.VNI != VXLANVNI {
				problems = append(problems, fmt.Sprintf("%s -> %s: VXLAN link %q is %+v, want kind vxlan with VNI %d", h.NS, remote.Name, e.VXLANLink, l, VXLANVNI))
			}
		}
		for _, d := range have {
			if d != want.Driver {
				problems = append(problems, fmt.Sprintf("%s -> %s: leftover of the %s cable (pair is on %s): %s", h.NS, remote.Name, d, want.Driver, e))
			}
		}
		return e, problems
	}
	if len(have) > 0 {
		problems = append(problems, fmt.Sprintf("%s -> %s: no-connect pair, but the host has traces of %v: %s", h.NS, remote.Name, have, e))
	}
	return e, problems
}

// Dump is the raw host view, for failure logs.
func (h HostView) Dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "links:")
	names := make([]string, 0, len(h.Links))
	for n := range h.Links {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		l := h.Links[n]
		fmt.Fprintf(&b, " %s(%s", n, l.Kind)
		if l.Kind == "vxlan" {
			fmt.Fprintf(&b, " vni %d", l.VNI)
		}
		fmt.Fprintf(&b, " mtu %d)", l.MTU)
	}
	fmt.Fprintf(&b, "\nroutes:\n")
	for _, r := range h.Routes {
		fmt.Fprintf(&b, "  %s\n", r.Raw)
	}
	fmt.Fprintf(&b, "fdb: %v\n", h.FDB)
	if h.WGRead {
		for _, p := range h.WGPeers {
			fmt.Fprintf(&b, "wg peer %s… endpoint %s allowed %v handshake %s rx %d tx %d\n", p.PublicKey[:min(8, len(p.PublicKey))], p.Endpoint, p.AllowedIPs, p.LastHandshake.Format(time.TimeOnly), p.RxBytes, p.TxBytes)
		}
	} else {
		fmt.Fprintf(&b, "wg peers unreadable: %s\n", h.WGError)
	}
	fmt.Fprintf(&b, "swanctl --list-sas:\n%s%s", h.SAs, h.SAsError)
	return b.String()
}
