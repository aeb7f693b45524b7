// Package diagnose holds the checks of `cablectl diagnose`: pure functions of the agent's status
// document and of the probes cablectl ran on the node (probes.go plans them, cablectl runs them),
// each giving one Result. No I/O here, so every verdict is table-tested with fake statuses.
package diagnose

import (
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/specs" // the drivers' traits, without their datapaths
)

// Result is one check's verdict, as `cablectl diagnose -o json` prints it.
type Result struct {
	// Check names the check and what it looked at: "mtu west", "cable-port west", "charon",
	// "charon vxlan+ipsec".
	Check   string `json:"check"`
	OK      bool   `json:"ok"`
	Message string `json:"message"`
	// Hint says what to do about a failure ("" when OK).
	Hint string `json:"hint,omitempty"`
}

// Check names (the first word of Result.Check).
const (
	CheckBroker      = "broker"
	CheckCertificate = "certificate"
	CheckClockSkew   = "clock-skew"
	CheckConnected   = "connected"
	CheckMTU         = "mtu"
	CheckCablePort   = "cable-port"
	CheckCharon      = "charon"
	CheckDNS         = "dns"
	CheckEBPF        = "ebpf"
)

// Thresholds of the checks.
const (
	// MaxClockSkew is the skew beyond which the node's clock is called wrong: certificates and
	// join tokens are checked against the broker's clock, and logs of both sides stop lining up.
	MaxClockSkew = time.Second
	// CertificateWarnDays: a certificate closer to its expiry than this, whose renewal is overdue,
	// fails (the agent renews at two thirds of its lifetime; one not renewed by now will lapse).
	CertificateWarnDays = 7
)

// Probes are what cablectl measured on the node for the checks that need more than the status.
type Probes struct {
	// MTU is the DF probe through each cable, by remote cluster (see MTUTargets).
	MTU map[string]MTUProbe
	// DNS is the query to the agent's DNS listener; nil when DNS is off.
	DNS *DNSProbe
	// EBPF is the look at the pins and the cgroup; nil when the load balancer is off.
	EBPF *EBPFProbe
}

// MTUProbe is one DF probe pair through a cable: Size-byte ICMP payloads (a packet of the route
// MTU) with Don't Fragment set, and small ones for comparison.
type MTUProbe struct {
	Source, Target string
	MTU, Size      int
	// Sent and Received count the big probes, SmallSent and SmallReceived the small ones.
	Sent, Received           int
	SmallSent, SmallReceived int
	// Error is why the probe could not run, or a local error (e.g. "message too long").
	Error string
}

// DNSProbe is a query for dns-version.clusterset.local TXT to the agent's DNS listener.
type DNSProbe struct {
	Server string
	Rcode  string // NOERROR, SERVFAIL, ...; "" when no answer came
	Answer string // the TXT text
	Error  string
	RTT    time.Duration
}

// EBPFProbe is what cablectl found of the load balancer's programs.
type EBPFProbe struct {
	PinDir, CgroupPath string
	// MissingPins are the hooks whose link pin is absent; Detached the hooks with no program
	// attached to the cgroup.
	MissingPins, Detached []string
	Hooks                 int
	Error                 string
}

// MTUTarget is one cable to probe: from the node's health-check address to the remote one,
// at the connection's MTU.
type MTUTarget struct {
	Cluster, Source, Target string
	MTU                     int
}

// MTUTargets are the connections the MTU check probes: connected ones with probe addresses and
// an MTU. The others are reported by Run without a probe.
func MTUTargets(s *statusapi.Status) []MTUTarget {
	var out []MTUTarget
	for _, c := range s.Connections {
		if c.Health == nil || c.Health.Source == "" || c.Health.Target == "" || c.MTU <= 0 {
			continue
		}
		out = append(out, MTUTarget{Cluster: c.Cluster, Source: c.Health.Source, Target: c.Health.Target, MTU: c.MTU})
	}
	return out
}

// PayloadSize is the ICMP echo payload that makes a packet of mtu bytes: mtu less the IP header
// (20 bytes, IPv6 40) and the ICMP header (8).
func PayloadSize(mtu int, target string) int {
	hdr := 28
	if strings.Contains(target, ":") {
		hdr = 48
	}
	return mtu - hdr
}

// DNSServer is where the DNS check queries: the agent's listen address, a wildcard host made
// loopback. "" when DNS is off.
func DNSServer(s *statusapi.Status) string {
	if s.Services == nil || !s.Services.DNS.Enabled || s.Services.DNS.Listen == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(s.Services.DNS.Listen)
	if err != nil {
		return s.Services.DNS.Listen
	}
	if host == "" || host == "0.0.0.0" {
		host = "127.0.0.1"
	} else if host == "::" {
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// LoadBalancerOn says whether the eBPF load balancer is configured (the services datapath is on).
func LoadBalancerOn(s *statusapi.Status) bool {
	if s.Services == nil {
		return false
	}
	lb := s.Services.LoadBalancer
	return lb.Running || lb.CgroupPath != "" || lb.Error != ""
}

// Run runs every check that applies to the node, in a fixed order: the broker, the clock, then
// per remote cluster (by name) its connection, cable port and MTU, then charon, DNS and eBPF.
func Run(s *statusapi.Status, p Probes, now time.Time) []Result {
	out := []Result{checkBroker(s), checkCertificate(s, now), checkClockSkew(s)}
	out = append(out, checkPairs(s, p, now)...)
	out = append(out, checkCharon(s)...)
	if s.Services != nil && s.Services.DNS.Enabled {
		out = append(out, checkDNS(s, p.DNS))
	}
	if LoadBalancerOn(s) {
		out = append(out, checkEBPF(s, p.EBPF))
	}
	return out
}

// Failed counts the results that are not OK.
func Failed(rs []Result) int {
	n := 0
	for _, r := range rs {
		if !r.OK {
			n++
		}
	}
	return n
}

func pass(check, msg string) Result { return Result{Check: check, OK: true, Message: msg} }
func fail(check, msg, hint string) Result {
	return Result{Check: check, OK: false, Message: msg, Hint: hint}
}

func checkBroker(s *statusapi.Status) Result {
	b := s.Broker
	switch {
	case b.CertificateRefused:
		return fail(CheckBroker, fmt.Sprintf("the broker %s refused this node's certificate for good (revoked or joined again elsewhere): %s", b.Address, b.Error),
			"join the node again with a new join token (cablectl cluster join-token)")
	case !b.Connected:
		msg := fmt.Sprintf("not connected to the broker %s", b.Address)
		if b.Error != "" {
			msg += ": " + b.Error
		}
		if b.Cached {
			msg += " (running on cached state)"
		}
		return fail(CheckBroker, msg, "check that the broker runs and that this node reaches its address (firewall, DNS, routes); the agent keeps its tunnels meanwhile")
	}
	return pass(CheckBroker, fmt.Sprintf("connected to the broker %s at revision %d", b.Address, b.Revision))
}

func checkCertificate(s *statusapi.Status, now time.Time) Result {
	b := s.Broker
	if b.CertificateNotAfter == nil {
		return fail(CheckCertificate, "the agent reports no node certificate (not joined yet?)",
			"check the agent's joinTokenFile and its log: the node joins with a join token and gets its certificate from the broker")
	}
	na := b.CertificateNotAfter.UTC()
	left := na.Sub(now)
	days := int(math.Floor(left.Hours() / 24))
	switch {
	case left <= 0:
		return fail(CheckCertificate, fmt.Sprintf("the node certificate expired on %s (%d days ago)", na.Format(time.RFC3339), -days),
			"join the node again with a new join token: an expired certificate cannot be renewed")
	case b.CertificateRenewAt != nil && now.After(*b.CertificateRenewAt) && days < CertificateWarnDays:
		return fail(CheckCertificate, fmt.Sprintf("the node certificate expires in %d days (%s) and its renewal, due %s, has not happened", days, na.Format(time.RFC3339), b.CertificateRenewAt.UTC().Format(time.RFC3339)),
			"the agent renews over its broker connection: fix the broker check first, then watch the agent's log for the renewal")
	}
	return pass(CheckCertificate, fmt.Sprintf("the node certificate is valid for %d more days (until %s)", days, na.Format(time.RFC3339)))
}

func checkClockSkew(s *statusapi.Status) Result {
	b := s.Broker
	if b.ClockSkewMs == nil {
		why := "no register or heartbeat reply from the broker yet"
		if !s.Gateway {
			why = "only gateways exchange heartbeats with the broker"
		}
		return pass(CheckClockSkew, "not measured: "+why)
	}
	skew := time.Duration(*b.ClockSkewMs * float64(time.Millisecond))
	unc := time.Duration(0)
	if b.ClockSkewUncertaintyMs != nil {
		unc = time.Duration(*b.ClockSkewUncertaintyMs * float64(time.Millisecond))
	}
	dir := "ahead of"
	if skew < 0 {
		dir = "behind"
	}
	abs := skew.Abs()
	// Only a skew larger than the measurement's own uncertainty allows counts.
	if abs-unc > MaxClockSkew {
		return fail(CheckClockSkew, fmt.Sprintf("the broker's clock is %s %s this node's (±%s), more than %s", abs.Round(time.Millisecond), dir, unc.Round(time.Millisecond), MaxClockSkew),
			"synchronise the clocks of this node and the broker (NTP: chronyc tracking, timedatectl): certificates and join tokens are checked against them")
	}
	return pass(CheckClockSkew, fmt.Sprintf("the broker's clock is %s %s this node's (±%s)", abs.Round(time.Millisecond), dir, unc.Round(time.Millisecond)))
}

// checkPairs checks, per remote cluster the policies connect this one to, its connection, its
// cable port and the MTU through it.
func checkPairs(s *statusapi.Status, p Probes, now time.Time) []Result {
	conns := map[string]statusapi.Connection{}
	for _, c := range s.Connections {
		conns[c.Cluster] = c
	}
	want := map[string]statusapi.Decision{}
	for _, d := range s.Decisions {
		if d.Connect {
			want[d.Cluster] = d
		}
	}
	// A connection the status shows without a decision (a non-gateway node's view, or an older
	// agent) is checked too.
	names := []string{}
	for n := range want {
		names = append(names, n)
	}
	for n := range conns {
		if _, ok := want[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []Result
	for _, n := range names {
		c, ok := conns[n]
		d := want[n]
		if !ok {
			out = append(out, fail(CheckConnected+" "+n, fmt.Sprintf("policy %s connects %s and %s over %s, but this gateway has no connection to %s", policyName(d), s.Cluster, n, d.Driver, n),
				"see `cablectl status` for the pair's problem and the agent's log for why it was not connected"))
			continue
		}
		out = append(out, checkConnected(s, c, d))
		out = append(out, checkCablePort(c, now))
		out = append(out, checkMTU(c, p.MTU))
	}
	return out
}

func policyName(d statusapi.Decision) string {
	switch {
	case d.Policy != "":
		return d.Policy
	case d.Default:
		return "(mesh default)"
	}
	return "(none)"
}

func checkConnected(s *statusapi.Status, c statusapi.Connection, d statusapi.Decision) Result {
	name := CheckConnected + " " + c.Cluster
	pol := c.Policy
	if pol == "" {
		pol = policyName(d)
	}
	if c.State == "connected" {
		return pass(name, fmt.Sprintf("policy %s connects %s and %s over %s: connected to %s", pol, s.Cluster, c.Cluster, c.Driver, c.Endpoint))
	}
	msg := fmt.Sprintf("policy %s connects %s and %s over %s, but the connection is %s", pol, s.Cluster, c.Cluster, c.Driver, c.State)
	if c.Message != "" {
		msg += ": " + c.Message
	}
	return fail(name, msg, "see the cable-port and mtu checks of "+c.Cluster+" and `cablectl status -o wide`")
}

// checkCablePort says whether the remote gateway's cable port answers, by the evidence the
// driver's handshake gives (its spec's traits): a recent session handshake (WireGuard), an
// established security association (IPsec's IKE_SA), or, without a handshake (VXLAN), the probes
// through it.
func checkCablePort(c statusapi.Connection, now time.Time) Result {
	name := CheckCablePort + " " + c.Cluster
	port := endpointPort(c.Endpoint)
	where := fmt.Sprintf("%s (UDP %s)", c.Endpoint, port)
	hint := fmt.Sprintf("check that UDP port %s is open on %s's gateway and on the path (firewalls, security groups, nft/iptables) and that its agent runs", port, c.Cluster)
	spec, _ := cable.LookupSpec(c.Driver) // an unknown driver has no handshake: the probes tell
	switch spec.Traits.Handshake {
	case cable.SessionHandshake:
		return checkSessionHandshake(name, spec, c, now, where, hint)
	case cable.EstablishedHandshake:
		if c.State == "connected" && c.LastHandshake != nil {
			return pass(name, fmt.Sprintf("IKE_SA with %s established %s ago", where, now.Sub(*c.LastHandshake).Round(time.Second)))
		}
		msg := "no IKE_SA established with " + where
		if c.Message != "" {
			msg += ": " + c.Message
		}
		return fail(name, msg, hint+" ("+spec.Traits.HandshakeNote+")")
	}
	return checkProbedTunnel(name, c, where, hint)
}

// checkSessionHandshake judges a driver whose ends handshake again and again: one must have
// completed, and with traffic flowing (the probes) within the session lifetime.
func checkSessionHandshake(name string, spec cable.Spec, c statusapi.Connection, now time.Time, where, hint string) Result {
	label, lifetime := spec.DisplayLabel(), spec.Traits.HandshakeLifetime
	if c.LastHandshake == nil {
		return fail(name, "no "+label+" handshake ever completed with "+where, hint+"; "+spec.Traits.HandshakeNote)
	}
	age := now.Sub(*c.LastHandshake)
	probed := c.Health != nil && c.Health.Probing
	if age > lifetime && probed {
		return fail(name, fmt.Sprintf("the last %s handshake with %s was %s ago, although probes keep traffic flowing (a session lasts %s)", label, where, age.Round(time.Second), lifetime), hint)
	}
	msg := fmt.Sprintf("%s handshake with %s %s ago", label, where, age.Round(time.Second))
	if !probed {
		msg += " (no probes: an idle tunnel handshakes only when traffic flows)"
	}
	return pass(name, msg)
}

// checkProbedTunnel judges a driver without a handshake: only the probes through the tunnel tell.
func checkProbedTunnel(name string, c statusapi.Connection, where, hint string) Result {
	h := c.Health
	switch {
	case h == nil || !h.Probing:
		reason := "probing is off"
		if h != nil && h.Reason != "" {
			reason = h.Reason
		}
		return pass(name, fmt.Sprintf("%s has no handshake and is not probed (%s): the port of %s is not checked", c.Driver, reason, where))
	case !h.Healthy:
		msg := fmt.Sprintf("probes through the %s tunnel to %s fail (%d in a row, %d of %d failed)", c.Driver, where, h.ConsecutiveFailures, h.ProbesFailed, h.ProbesSent)
		if h.LastError != "" {
			msg += ": " + h.LastError
		}
		return fail(name, msg, hint)
	case h.ProbesSent == 0:
		return pass(name, fmt.Sprintf("no probe through the %s tunnel to %s has run yet", c.Driver, where))
	}
	return pass(name, fmt.Sprintf("probes through the %s tunnel to %s answer (%d sent, %d failed)", c.Driver, where, h.ProbesSent, h.ProbesFailed))
}

func endpointPort(ep string) string {
	if _, port, err := net.SplitHostPort(ep); err == nil {
		return port
	}
	return "?"
}

func checkMTU(c statusapi.Connection, probes map[string]MTUProbe) Result {
	name := CheckMTU + " " + c.Cluster
	p, ok := probes[c.Cluster]
	if !ok {
		why := "the connection has no probe addresses or MTU"
		if c.Health != nil && !c.Health.Probing && c.Health.Reason != "" {
			why = c.Health.Reason
		}
		return pass(name, "not probed: "+why)
	}
	path := fmt.Sprintf("%s -> %s", p.Source, p.Target)
	hint := fmt.Sprintf("a hop of the underlay between the gateways carries less than the %s cable needs for MTU %d: raise the underlay MTU, or lower the cable's MTU setting, and make sure ICMP \"fragmentation needed\" is not filtered", c.Driver, p.MTU)
	switch {
	case p.Error != "" && strings.Contains(p.Error, "Cannot assign requested address"):
		// The probe source is the agent's address: cablectl runs elsewhere than the agent.
		return fail(name, fmt.Sprintf("DF probe of %d bytes (%s) could not run: %s", p.MTU, path, p.Error),
			"run cablectl diagnose on the node, in the agent's network namespace (the probes leave from the agent's address "+p.Source+")")
	case p.Error != "":
		return fail(name, fmt.Sprintf("DF probe of %d bytes (%s) could not run: %s", p.MTU, path, p.Error), hint)
	case p.Received > 0:
		return pass(name, fmt.Sprintf("%d-byte packets with DF set cross the cable (%s: %d/%d answered)", p.MTU, path, p.Received, p.Sent))
	case p.SmallReceived == 0:
		return fail(name, fmt.Sprintf("no answer through the cable at all (%s: %d-byte DF probes %d/%d, small probes %d/%d): the MTU cannot be measured", path, p.MTU, p.Received, p.Sent, p.SmallReceived, p.SmallSent),
			"see the connected and cable-port checks of "+c.Cluster)
	}
	return fail(name, fmt.Sprintf("MTU black hole: %d-byte packets with DF set are lost (%d/%d answered) while small ones cross (%d/%d), %s", p.MTU, p.Received, p.Sent, p.SmallReceived, p.SmallSent, path), hint)
}

// charonDrivers are the cable drivers that run a charon of their own (their specs' Daemon trait),
// in the order their checks are reported: by name.
func charonDrivers() []cable.Spec {
	var out []cable.Spec
	for _, s := range cable.Specs() {
		if s.Traits.Daemon == CheckCharon {
			out = append(out, s)
		}
	}
	return out
}

// checkCharon checks the charon of each driver in charonDrivers that is configured or used: one
// result per driver, "charon" for the driver that owns the daemon's name (ipsec), "charon
// <driver>" for the others.
func checkCharon(s *statusapi.Status) []Result {
	var out []Result
	for _, spec := range charonDrivers() {
		if r, ok := checkDriverCharon(s, spec); ok {
			out = append(out, r)
		}
	}
	return out
}

// checkDriverCharon applies where driver (one of charonDrivers) is configured or used.
func checkDriverCharon(s *statusapi.Status, spec cable.Spec) (Result, bool) {
	driver := spec.Name
	var ds *statusapi.DriverStatus
	for i := range s.Drivers {
		if s.Drivers[i].Name == driver {
			ds = &s.Drivers[i]
		}
	}
	used := false
	for _, c := range s.Connections {
		used = used || c.Driver == driver
	}
	if ds == nil && !used {
		return Result{}, false
	}
	// The daemon's owner (ipsec) keeps the check's plain name (and its messages say just
	// "charon"); another driver's charon is a different process, so its check and messages name
	// the driver.
	name, who := CheckCharon, "charon"
	if !spec.Traits.OwnsDaemonName {
		name, who = CheckCharon+" "+driver, "charon of "+driver
	}
	hint := "charon runs detached from the agent (its log: STATEDIR/" + driver + "/charon.log); the agent restarts one that exited, not one that is stopped (kill -CONT) or hangs"
	switch {
	case ds == nil:
		return fail(name, "a pair uses "+driver+" but this gateway does not run the "+driver+" driver", "add "+driver+" to cableDrivers"), true
	case !ds.Running:
		return fail(name, "the "+driver+" driver does not run: "+ds.Error, hint), true
	case ds.Daemon == nil:
		return fail(name, "the agent reports nothing of "+who+" (an older agent?)", hint), true
	}
	d := ds.Daemon
	pid := "pid " + strconv.Itoa(d.PID)
	if d.PID == 0 {
		pid = "system charon"
	}
	switch {
	case d.State != "running":
		msg := fmt.Sprintf("%s (%s) is %s", who, pid, d.State)
		if d.Error != "" {
			msg += "; vici: " + d.Error
		}
		return fail(name, msg, hint), true
	case !d.Answering:
		return fail(name, fmt.Sprintf("%s (%s) runs but does not answer on %s: %s", who, pid, d.Control, d.Error), hint), true
	}
	return pass(name, fmt.Sprintf("%s (%s) runs and answers on %s", who, pid, d.Control)), true
}

func checkDNS(s *statusapi.Status, p *DNSProbe) Result {
	hint := "see services.dns in `cablectl status -o json` and the agent's log"
	switch {
	case s.Services.DNS.Error != "":
		return fail(CheckDNS, "the agent's DNS server does not run: "+s.Services.DNS.Error, hint)
	case p == nil:
		return fail(CheckDNS, "the DNS server was not queried", hint)
	case p.Error != "":
		return fail(CheckDNS, fmt.Sprintf("no answer from %s to dns-version.clusterset.local TXT: %s", p.Server, p.Error), hint)
	case p.Rcode != "NOERROR" || p.Answer == "":
		msg := fmt.Sprintf("%s answered dns-version.clusterset.local TXT with %s and no version", p.Server, p.Rcode)
		if p.Rcode == "SERVFAIL" && !s.Services.ImportsKnown {
			msg += " (the agent has not received the imports yet)"
			hint = "the DNS server answers once the broker sent the imports: fix the broker check first"
		}
		return fail(CheckDNS, msg, hint)
	}
	return pass(CheckDNS, fmt.Sprintf("%s answers dns-version.clusterset.local TXT %q in %s", p.Server, p.Answer, p.RTT.Round(time.Microsecond)))
}

func checkEBPF(s *statusapi.Status, p *EBPFProbe) Result {
	lb := s.Services.LoadBalancer
	hint := "the agent attaches its socket programs to cgroupPath and pins them under bpfPinDir (bpffs must be mounted): see the agent's log"
	switch {
	case !lb.Running:
		return fail(CheckEBPF, "the eBPF load balancer does not run: "+lb.Error, hint)
	case p == nil:
		return fail(CheckEBPF, "the programs were not looked at", hint)
	case p.Error != "":
		return fail(CheckEBPF, "cannot look at the eBPF programs: "+p.Error, hint)
	case len(p.MissingPins) > 0 || len(p.Detached) > 0:
		var parts []string
		if len(p.MissingPins) > 0 {
			parts = append(parts, "no pin under "+p.PinDir+" for "+strings.Join(p.MissingPins, ", "))
		}
		if len(p.Detached) > 0 {
			parts = append(parts, "nothing attached to "+p.CgroupPath+" for "+strings.Join(p.Detached, ", "))
		}
		return fail(CheckEBPF, strings.Join(parts, "; "), hint+"; restarting the agent attaches them again")
	}
	return pass(CheckEBPF, fmt.Sprintf("%d socket programs pinned under %s and attached to %s (%d services in the maps)", p.Hooks, p.PinDir, p.CgroupPath, lb.Services))
}
