package netns

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable/vxlanipsec"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// DriverVXLANIPsec is the combined cable (cable/vxlanipsec).
const DriverVXLANIPsec = vxlanipsec.Name

// vxlanIPsecConfig is the agent config of a gateway offering wireguard (the mesh default),
// vxlan and vxlan+ipsec.
func vxlanIPsecConfig() string {
	return fmt.Sprintf(`cableDrivers: [wireguard, vxlan, %s]
vxlan: {port: %d, vni: %d}
`, DriverVXLANIPsec, harness.VXLANPort, harness.VXLANVNI)
}

// noESPReason is what the agent must say about vxlan+ipsec on a kernel without ESP: the driver's
// own explanation (vxlanipsec.ErrNoKernelESP), which names kernel-libipsec's missing transport
// mode.
const noESPReason = "kernel-libipsec (the ipsec driver's fallback here) has no transport mode"

// TestVxlanIPsecRefusedWithoutKernelESP: on a kernel without ESP (this machine's), a policy that
// puts one pair of a three-cluster mesh on vxlan+ipsec leaves that pair down with state error
// and the reason, in `cablectl status` (JSON and table) at both ends and in the agents' driver
// lists, while the pairs with the third cluster connect over the default driver and carry
// traffic; moving the policy to vxlan heals the pair. Where the kernel has ESP the driver works,
// and TestKernelVxlanIPsec tests it (in the VM).
func TestVxlanIPsecRefusedWithoutKernelESP(t *testing.T) {
	harness.RequireRoot(t)
	if _, espErr := probeKernelDatapaths(); espErr == nil {
		t.Skipf("skipping: this kernel (%s) has ESP, so vxlan+ipsec is not refused here; TestKernelVxlanIPsec tests the cable", kernelRelease())
	}
	m := harness.New(t)
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "pair=switch", vxlanIPsecConfig())
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "pair=switch", vxlanIPsecConfig())
	north := m.AddLabelledCluster("north", "10.3.0.0/16", "", vxlanIPsecConfig())
	all := []*harness.Cluster{east, west, north}
	// `cablectl connection-policy apply` takes the driver name with its '+'.
	m.Apply(m.PolicyFile("switch-pair-vxlan-ipsec.yaml", pairPolicy(DriverVXLANIPsec)))
	started := time.Now()
	for _, c := range all {
		c.StartAgent()
		c.StartTCPServer()
	}

	// The refused pair, seen from both ends; the other pairs connected over the default.
	var last map[string]statusapi.Status
	err := harness.WaitFor(ConnectTimeout, 250*time.Millisecond, func() (bool, string) {
		last = map[string]statusapi.Status{}
		var problems []string
		for _, c := range all {
			st, err := c.Status()
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c.Name, err))
				continue
			}
			last[c.Name] = st
			problems = append(problems, refusedPairProblems(c.Name, st, map[*harness.Cluster]string{east: "west", west: "east"}[c])...)
			for _, o := range all {
				if o == c || (c != north && o != north) {
					continue
				}
				if _, ok, desc := harness.Matches(st, o.Name, harness.Connected(harness.DriverWireGuard)); !ok {
					problems = append(problems, c.Name+" -> "+desc)
				}
			}
		}
		return len(problems) == 0, strings.Join(problems, "\n")
	})
	if err != nil {
		t.Fatalf("the refused pair and the healthy ones after %s: %v", time.Since(started).Round(time.Millisecond), err)
	}
	cn, _ := harness.Connection(last["east"], "west")
	m.Logf("east -> west after %s: %s %s: %s", time.Since(started).Round(time.Millisecond), cn.Driver, cn.State, cn.Message)
	for _, d := range last["east"].Drivers {
		m.Logf("east driver %s running=%v port=%d error=%q", d.Name, d.Running, d.Port, d.Error)
	}
	table := east.StatusTable()
	if !strings.Contains(table, DriverVXLANIPsec) || !strings.Contains(table, "error") || !strings.Contains(table, "no transport mode") {
		t.Errorf("`cablectl status` does not show the pair's driver, state error and the reason:\n%s", table)
	}

	// The other pairs carry traffic; the refused one carries none (nothing routes it).
	for _, p := range [][2]*harness.Cluster{{east, north}, {north, west}} {
		if r := m.TCPCheck(p[0].PodNS, p[1].PodIP); r.Err != nil || strings.TrimSpace(r.Stdout) != "ok" {
			t.Errorf("tcp %s pod -> %s pod beside the refused pair: %s", p[0].Name, p[1].Name, r)
		}
	}
	if r := m.Ping(east.PodNS, west.PodIP, 2, 300*time.Millisecond); r.Received != 0 {
		t.Errorf("ping east pod -> west pod over a refused cable: %d replies, want none", r.Received)
	}

	// Back to vxlan: the pair heals, the others stay as they were.
	t0 := m.Apply(m.PolicyFile("switch-pair-vxlan.yaml", pairPolicy(harness.DriverVXLAN)))
	conv := m.WaitWants(PolicyTimeout, t0, all, harness.Wants{harness.PairKey("east", "west"): harness.Connected(harness.DriverVXLAN)},
		harness.Connected(harness.DriverWireGuard))
	m.Logf("east <-> west healed over vxlan %s after the policy moved", conv.ConnectedAfter("east", "west").Round(time.Millisecond))
	if r := m.TCPCheck(east.PodNS, west.PodIP); r.Err != nil || strings.TrimSpace(r.Stdout) != "ok" {
		t.Errorf("tcp east pod -> west pod over vxlan after the move: %s", r)
	}
	if ok, r := m.PingOK(west.PodNS, east.PodIP, 3); !ok {
		t.Errorf("ping west pod -> east pod over vxlan after the move: %d/%d: %v %s", r.Received, r.Transmitted, r.Err, r.Output)
	}
	st, err := east.Status()
	if err != nil {
		t.Fatal(err)
	}
	// The driver itself stays refused: only the pair moved off it.
	if problems := refusedDriverProblems("east", st); len(problems) > 0 {
		t.Errorf("%s", strings.Join(problems, "\n"))
	}
}

// refusedPairProblems lists what st (cluster name's status) lacks to show the refusal: the
// driver in its list, not running, with the reason; and, when remote is set, that pair's row
// with the driver, state error and the reason.
func refusedPairProblems(name string, st statusapi.Status, remote string) []string {
	problems := refusedDriverProblems(name, st)
	if remote == "" {
		return problems
	}
	cn, ok := harness.Connection(st, remote)
	switch {
	case !ok:
		problems = append(problems, fmt.Sprintf("%s -> %s: no status row", name, remote))
	case cn.Driver != DriverVXLANIPsec || cn.State != "error" || !strings.Contains(cn.Message, noESPReason):
		problems = append(problems, fmt.Sprintf("%s -> %s: %s %s (%s), want %s error saying %q", name, remote, cn.Driver, cn.State, cn.Message, DriverVXLANIPsec, noESPReason))
	}
	return problems
}

func refusedDriverProblems(name string, st statusapi.Status) []string {
	for _, d := range st.Drivers {
		if d.Name != DriverVXLANIPsec {
			continue
		}
		if d.Running || !strings.Contains(d.Error, noESPReason) {
			return []string{fmt.Sprintf("%s: driver %s running=%v error %q, want not running, saying %q", name, d.Name, d.Running, d.Error, noESPReason)}
		}
		return nil
	}
	return []string{fmt.Sprintf("%s: driver %s is not in the agent's driver list %+v", name, DriverVXLANIPsec, st.Drivers)}
}
