package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"
)

// Gateway mode: clusters joined with --gateway-mode, their mesh addresses, and a capture
// on a cable link that shows which addresses travel over it.

// AddGatewayModeCluster adds a cluster like AddLabelledCluster, joined in gateway mode
// (`cablectl cluster join-token --gateway-mode`): the broker admits its pod CIDR even when it
// overlaps another gateway-mode cluster's. extra is appended to the agent config. The agent is
// not started.
func (m *Mesh) AddGatewayModeCluster(name, podCIDR, extra string) *Cluster {
	m.T.Helper()
	c := m.NewCluster(name, podCIDR)
	r := m.JoinToken(name, podCIDR, "--gateway-mode")
	if r.Err != nil {
		m.T.Fatalf("join token for %s in gateway mode: %s", name, r)
	}
	c.WriteToken(strings.TrimSpace(r.Stdout))
	c.WriteConfig(extra)
	return c
}

// MeshAddress is the mesh address c's agent reports (invalid when none yet).
func (c *Cluster) MeshAddress() netip.Addr {
	st, err := c.Status()
	if err != nil {
		return netip.Addr{}
	}
	a, _ := netip.ParseAddr(st.MeshAddress)
	return a
}

// WaitMeshAddresses waits until every cluster's agent has a mesh address, on its cbl-mesh0, and
// returns them by cluster name.
func (m *Mesh) WaitMeshAddresses(timeout time.Duration, clusters ...*Cluster) map[string]netip.Addr {
	m.T.Helper()
	out := map[string]netip.Addr{}
	err := WaitFor(timeout, 200*time.Millisecond, func() (bool, string) {
		var missing []string
		for _, c := range clusters {
			if _, ok := out[c.Name]; ok {
				continue
			}
			st, err := c.Status()
			a, perr := netip.ParseAddr(st.MeshAddress)
			if err != nil || perr != nil || st.Ingress == nil || st.Ingress.Dataplane == nil || st.Ingress.Dataplane.MeshLink == "" {
				missing = append(missing, fmt.Sprintf("%s (err %v, meshAddress %q, ingress %+v)", c.Name, err, st.MeshAddress, st.Ingress))
				continue
			}
			out[c.Name] = a
		}
		return len(missing) == 0, "no mesh address on: " + strings.Join(missing, "; ")
	})
	if err != nil {
		m.T.Fatalf("mesh addresses: %v", err)
	}
	return out
}

// CaptureReport is what `tcpcheck capture` saw on a link: every IPv4 address with its count.
type CaptureReport struct {
	Packets int            `json:"packets"`
	IPv4    int            `json:"ipv4"`
	Addrs   map[string]int `json:"addrs"`
}

// Capture is a running capture on one link of a namespace.
type Capture struct {
	p    *Process
	link string
}

// StartCapture starts an AF_PACKET capture (tcpcheck capture) on link in namespace ns, for at
// most max, and waits until its socket is bound.
func (m *Mesh) StartCapture(ns, link string, max time.Duration) *Capture {
	m.T.Helper()
	name := "capture-" + ns + "-" + link
	p, err := StartProcess(name, ns, filepath.Join(m.Dir, name+".log"), m.Bin.TCPCheck, "capture", "-iface", link, "-duration", max.String())
	m.must(err)
	m.track(p)
	if err := WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(p.Log(), "capturing"), p.Log()
	}); err != nil {
		m.T.Fatalf("%s: %v", name, err)
	}
	return &Capture{p: p, link: link}
}

// Stop ends the capture and returns its report.
func (c *Capture) Stop() (CaptureReport, error) {
	if _, err := c.p.Stop(5 * time.Second); err != nil {
		return CaptureReport{}, err
	}
	var r CaptureReport
	line := lastLine(c.p.Log())
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return r, fmt.Errorf("capture on %s: %q: %w", c.link, line, err)
	}
	return r, nil
}

// Within lists the captured addresses inside p, with their counts.
func (r CaptureReport) Within(p netip.Prefix) []string {
	var out []string
	for s, n := range r.Addrs {
		if a, err := netip.ParseAddr(s); err == nil && p.Contains(a) {
			out = append(out, fmt.Sprintf("%s (%d)", s, n))
		}
	}
	return out
}
