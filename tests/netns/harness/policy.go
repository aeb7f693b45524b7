package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// The three cable drivers, by their registry names.
const (
	DriverWireGuard = "wireguard"
	DriverVXLAN     = "vxlan"
	DriverIPsec     = "ipsec"
)

// Drivers lists every cable driver, in the order the tests walk them.
var Drivers = []string{DriverWireGuard, DriverVXLAN, DriverIPsec}

// Ports and names the multi-driver agent config (MultiDriverConfig) gives every gateway.
const (
	VXLANPort    = 4789
	VXLANVNI     = 100
	IPsecPort    = 500
	IPsecNATPort = 4500
	// VXLANLinkPrefix starts the name of every VXLAN link the vxlan driver makes (cbl-vx<VNI>).
	VXLANLinkPrefix = "cbl-vx"
	// IPsecTable is the routing table charon installs its routes in.
	IPsecTable = 220
	// RouteProtocol marks the routes the wireguard and vxlan drivers install.
	RouteProtocol = 157
)

// MultiDriverConfig is the agent config a gateway needs to run all three drivers (
// cableDrivers, vxlan and ipsec fields), to append to Cluster.ConfigYAML.
func MultiDriverConfig() string {
	return fmt.Sprintf(`cableDrivers: [wireguard, vxlan, ipsec]
vxlan: {port: %d, vni: %d}
ipsec: {port: %d, nattPort: %d}
`, VXLANPort, VXLANVNI, IPsecPort, IPsecNATPort)
}

// AddLabelledCluster adds a cluster like AddCluster, with labels ("k=v,k2=v2", given to
// `cluster join-token --labels`) and extra agent config appended verbatim (e.g.
// MultiDriverConfig()). The agent is not started.
func (m *Mesh) AddLabelledCluster(name, podCIDR, labels, extra string) *Cluster {
	m.T.Helper()
	c := m.NewCluster(name, podCIDR)
	var flags []string
	if labels != "" {
		flags = append(flags, "--labels", labels)
	}
	r := m.JoinToken(name, podCIDR, flags...)
	if r.Err != nil {
		m.T.Fatalf("join token for %s (labels %q): %s", name, labels, r)
	}
	c.WriteToken(strings.TrimSpace(r.Stdout))
	c.WriteConfig(extra)
	return c
}

// PolicyFile writes a policy YAML file into the run's dir and returns its path.
func (m *Mesh) PolicyFile(name, yaml string) string {
	m.T.Helper()
	dir := filepath.Join(m.Dir, "policies")
	m.must(os.MkdirAll(dir, 0o700))
	p := filepath.Join(dir, name)
	m.must(os.WriteFile(p, []byte(yaml), 0o600))
	return p
}

// SeedPolicy returns the path of one of the examples of Submariner's connectivity proposal as the proposal writes them, byte for
// byte (policy/testdata/seed004/<file>).
func (m *Mesh) SeedPolicy(file string) string {
	m.T.Helper()
	root, err := ModuleRoot(m.Ctx)
	m.must(err)
	p := filepath.Join(root, "policy", "testdata", "seed004", file)
	if _, err := os.Stat(p); err != nil {
		m.T.Fatalf("seed 004 example: %v", err)
	}
	return p
}

// Apply runs `cablectl apply -f path` and fails the test when it fails. It returns the time
// cablectl returned, from which the tests measure how long the mesh takes to follow.
func (m *Mesh) Apply(path string) time.Time {
	m.T.Helper()
	r := m.Cablectl("apply", "-f", path)
	if r.Err != nil {
		m.T.Fatalf("cablectl apply -f %s: %s", filepath.Base(path), r)
	}
	m.Logf("cablectl apply -f %s: %s%s", filepath.Base(path), strings.TrimSpace(r.Stdout), stderrSuffix(r))
	return time.Now()
}

// DeletePolicies runs `cablectl delete -f path`, failing the test when it fails.
func (m *Mesh) DeletePolicies(path string) time.Time {
	m.T.Helper()
	r := m.Cablectl("delete", "-f", path)
	if r.Err != nil {
		m.T.Fatalf("cablectl delete -f %s: %s", filepath.Base(path), r)
	}
	m.Logf("cablectl delete -f %s: %s%s", filepath.Base(path), strings.TrimSpace(r.Stdout), stderrSuffix(r))
	return time.Now()
}

// Label runs `cablectl cluster label NAME k=v [k-]...`, failing the test when it fails.
func (m *Mesh) Label(cluster string, changes ...string) time.Time {
	m.T.Helper()
	r := m.Cablectl(append([]string{"cluster", "label", cluster}, changes...)...)
	if r.Err != nil {
		m.T.Fatalf("cablectl cluster label %s %v: %s", cluster, changes, r)
	}
	m.Logf("cablectl cluster label %s %s", cluster, strings.Join(changes, " "))
	return time.Now()
}

// Explain is `cablectl connection-policy explain A B` (output only, for the logs).
func (m *Mesh) Explain(a, b string) string {
	r := m.Cablectl("connection-policy", "explain", a, b)
	return strings.TrimSpace(r.Stdout + r.Stderr)
}

func stderrSuffix(r Result) string {
	if s := strings.TrimSpace(r.Stderr); s != "" {
		return " (stderr: " + s + ")"
	}
	return ""
}

// Want is what one cluster pair should be: connected over Driver, or not connected at all.
type Want struct {
	Connect bool
	Driver  string
}

func (w Want) String() string {
	if !w.Connect {
		return "no-connect"
	}
	return w.Driver
}

// Connected over driver d.
func Connected(d string) Want { return Want{Connect: true, Driver: d} }

// NoConnect is a pair that must have no tunnel.
var NoConnect = Want{}

// PairKey names an unordered pair the same way whichever end comes first.
func PairKey(a, b string) string {
	if b < a {
		a, b = b, a
	}
	return a + "<->" + b
}

// Wants maps PairKey to the wanted state of every pair of a mesh.
type Wants map[string]Want

// Of returns the wanted state of the pair (a, b); pairs not listed want fallback.
func (w Wants) Of(a, b string, fallback Want) Want {
	if x, ok := w[PairKey(a, b)]; ok {
		return x
	}
	return fallback
}

// Matches reports whether status st of cluster c shows exactly what want says about remote:
// applied (the right driver; for a no-connect pair no connection row, or one without a driver)
// and, for a connect pair, connected.
func Matches(st statusapi.Status, remote string, want Want) (applied, connected bool, desc string) {
	cn, ok := Connection(st, remote)
	if !want.Connect {
		// A row without a driver is a pair the agent knows of but runs no cable for.
		if ok && cn.Driver != "" {
			return false, false, fmt.Sprintf("%s: want no connection, have %s %s", remote, cn.Driver, cn.State)
		}
		return true, true, ""
	}
	switch {
	case !ok:
		return false, false, fmt.Sprintf("%s: want %s, have no connection", remote, want.Driver)
	case cn.Driver != want.Driver:
		return false, false, fmt.Sprintf("%s: want %s, have %s %s", remote, want.Driver, cn.Driver, cn.State)
	case cn.State != "connected":
		return true, false, fmt.Sprintf("%s: %s %s (%s)", remote, cn.Driver, cn.State, cn.Message)
	}
	return true, true, ""
}

// Convergence is when each cluster's agent first showed the wanted state for all its pairs.
type Convergence struct {
	Since     time.Time
	Applied   map[string]time.Time // the right driver (or no row) for every pair
	Connected map[string]time.Time // and every connect pair connected
	// SlowestStatus is the longest `cablectl status` call while waiting: the times above are
	// when a call returned, so they are late by up to this much.
	SlowestStatus time.Duration
}

// AppliedAfter is how long after Since the slowest of clusters showed every pair applied.
func (c Convergence) AppliedAfter(clusters ...string) time.Duration {
	return c.slowest(c.Applied, clusters)
}

// ConnectedAfter is how long after Since the slowest of clusters showed every pair connected.
func (c Convergence) ConnectedAfter(clusters ...string) time.Duration {
	return c.slowest(c.Connected, clusters)
}

func (c Convergence) slowest(at map[string]time.Time, clusters []string) time.Duration {
	var d time.Duration
	for _, n := range clusters {
		if x := at[n].Sub(c.Since); x > d {
			d = x
		}
	}
	return d
}

// WaitWants polls every cluster's status until each shows, for every other cluster, what wants
// says (pairs not listed want fallback), and returns when each cluster got there. Pairs that
// should connect but are not yet connected get a ping (WireGuard hands shake on traffic).
func (m *Mesh) WaitWants(timeout time.Duration, since time.Time, clusters []*Cluster, wants Wants, fallback Want) Convergence {
	m.T.Helper()
	conv := Convergence{Since: since, Applied: map[string]time.Time{}, Connected: map[string]time.Time{}}
	lastPing := map[string]time.Time{}
	err := WaitFor(timeout, 100*time.Millisecond, func() (bool, string) {
		var problems []string
		for _, c := range clusters {
			if _, done := conv.Connected[c.Name]; done {
				continue
			}
			if c.Agent != nil {
				if ok, code := c.Agent.Exited(); ok {
					m.T.Fatalf("agent %s exited with code %d:\n%s", c.Name, code, c.Agent.LogTail(40))
				}
			}
			callStart := time.Now()
			st, err := c.Status()
			now := time.Now()
			if d := now.Sub(callStart); d > conv.SlowestStatus {
				conv.SlowestStatus = d
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c.Name, err))
				continue
			}
			allApplied, allConnected := true, true
			for _, o := range clusters {
				if o == c {
					continue
				}
				w := wants.Of(c.Name, o.Name, fallback)
				applied, connected, desc := Matches(st, o.Name, w)
				allApplied = allApplied && applied
				allConnected = allConnected && connected
				if desc != "" {
					problems = append(problems, c.Name+" -> "+desc)
				}
				if applied && !connected && now.Sub(lastPing[c.Name+o.Name]) > time.Second {
					lastPing[c.Name+o.Name] = now
					m.Ping(c.PodNS, o.PodIP, 1, 100*time.Millisecond)
				}
			}
			if _, ok := conv.Applied[c.Name]; !ok && allApplied {
				conv.Applied[c.Name] = now
			}
			if allApplied && allConnected {
				conv.Connected[c.Name] = now
			}
		}
		return len(problems) == 0, strings.Join(problems, "; ")
	})
	if err != nil {
		m.T.Fatalf("the mesh did not reach the wanted state %s: %v", wants.describe(clusters, fallback), err)
	}
	return conv
}

func (w Wants) describe(clusters []*Cluster, fallback Want) string {
	var parts []string
	for i, a := range clusters {
		for _, b := range clusters[i+1:] {
			parts = append(parts, PairKey(a.Name, b.Name)+"="+w.Of(a.Name, b.Name, fallback).String())
		}
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

// Changed lists the clusters with at least one pair whose wanted state differs between before
// and after: the agents a policy change affects.
func Changed(clusters []*Cluster, before Wants, beforeFallback Want, after Wants, afterFallback Want) []string {
	var out []string
	for _, c := range clusters {
		for _, o := range clusters {
			if o != c && before.Of(c.Name, o.Name, beforeFallback) != after.Of(c.Name, o.Name, afterFallback) {
				out = append(out, c.Name)
				break
			}
		}
	}
	return out
}

// CheckHosts reads every gateway's host view and checks every pair against wants from both ends
// (see CheckPair). It returns the problems and, for the logs, a one-line summary per pair end.
func (m *Mesh) CheckHosts(clusters []*Cluster, wants Wants, fallback Want) (problems, summary []string) {
	views := map[string]HostView{}
	for _, c := range clusters {
		views[c.Name] = c.Host()
	}
	for _, c := range clusters {
		h := views[c.Name]
		bad := false
		for _, o := range clusters {
			if o == c {
				continue
			}
			w := wants.Of(c.Name, o.Name, fallback)
			e, p := CheckPair(h, o, w)
			problems = append(problems, p...)
			bad = bad || len(p) > 0
			summary = append(summary, fmt.Sprintf("%s -> %s: want %s, host has %v", c.Name, o.Name, w, e.Drivers()))
		}
		if bad {
			problems = append(problems, fmt.Sprintf("host view of %s:\n%s", c.GwNS, h.Dump()))
		}
	}
	return problems, summary
}

// CheckTraffic checks, for every ordered pair of clusters, that pod-to-pod ping and TCP work
// where wants says connect and fail where it says no-connect. Every cluster needs its
// StartTCPServer running. It returns the problems found.
func (m *Mesh) CheckTraffic(clusters []*Cluster, wants Wants, fallback Want) []string {
	var problems []string
	for _, from := range clusters {
		for _, to := range clusters {
			if from == to {
				continue
			}
			w := wants.Of(from.Name, to.Name, fallback)
			if w.Connect {
				if ok, r := m.PingOK(from.PodNS, to.PodIP, 3); !ok {
					// One lost echo of three is logged, and the pair gets a second chance of 5
					// echoes that must all come back: a broken pair loses those too.
					m.Logf("ping %s pod -> %s pod over %s: %d/%d replies; pinging 5 more", from.Name, to.Name, w.Driver, r.Received, r.Transmitted)
					if ok, r := m.PingOK(from.PodNS, to.PodIP, 5); !ok {
						problems = append(problems, fmt.Sprintf("ping %s pod -> %s pod over %s: %d/%d replies: %v %s",
							from.Name, to.Name, w.Driver, r.Received, r.Transmitted, r.Err, r.Output))
					}
				}
				if r := m.TCPCheck(from.PodNS, to.PodIP); r.Err != nil || strings.TrimSpace(r.Stdout) != "ok" {
					problems = append(problems, fmt.Sprintf("tcp %s pod -> %s pod over %s: %s", from.Name, to.Name, w.Driver, r))
				}
				continue
			}
			if r := m.Ping(from.PodNS, to.PodIP, 2, 200*time.Millisecond); r.Received != 0 {
				problems = append(problems, fmt.Sprintf("ping %s pod -> %s pod crossed a no-connect pair: %d/%d replies", from.Name, to.Name, r.Received, r.Transmitted))
			}
			if r := m.TCPCheckWithin(from.PodNS, to.PodIP, 2*time.Second); r.Err == nil {
				problems = append(problems, fmt.Sprintf("tcp %s pod -> %s pod crossed a no-connect pair: %s", from.Name, to.Name, r))
			}
		}
	}
	return problems
}

// Charon is where the ipsec driver finds strongSwan's IKE daemon by default.
const Charon = "/usr/lib/ipsec/charon"

// RequireIPsec skips the test unless strongSwan's charon and swanctl are installed (the ipsec
// cable and the tests' view of its SAs need them; scripts/install-deps.sh installs them).
func RequireIPsec(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(Charon); err != nil {
		t.Skipf("skipping: the ipsec cable needs strongSwan's charon at %s (run scripts/install-deps.sh: strongswan-charon, strongswan-swanctl, libcharon-extra-plugins, libstrongswan-standard-plugins): %v", Charon, err)
	}
	if _, err := exec.LookPath("swanctl"); err != nil {
		t.Skipf("skipping: swanctl is not installed (run scripts/install-deps.sh): %v", err)
	}
}
