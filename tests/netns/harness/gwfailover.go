package harness

import (
	"fmt"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// SingleDriverConfig is the agent config a gateway needs to run only driver (cableDrivers and
// the driver's block), to append to Cluster.ConfigYAML; "" for wireguard, the default.
func SingleDriverConfig(driver string) string {
	switch driver {
	case DriverVXLAN:
		return fmt.Sprintf("cableDrivers: [vxlan]\nvxlan: {port: %d, vni: %d}\n", VXLANPort, VXLANVNI)
	case DriverIPsec:
		return fmt.Sprintf("cableDrivers: [ipsec]\nipsec: {port: %d, nattPort: %d}\n", IPsecPort, IPsecNATPort)
	}
	return ""
}

// ConnectionTo is the status row of st's connection to cluster remote; ok is false without one.
func ConnectionTo(st statusapi.Status, remote string) (statusapi.Connection, bool) {
	for _, c := range st.Connections {
		if c.Cluster == remote {
			return c, true
		}
	}
	return statusapi.Connection{}, false
}

// WaitProbedBy waits until gateway c's connection to remote goes to node over driver, is
// connected, and its health probes have answered (a pair whose probes never answered is not
// failed over: nothing says its remote gateway died). It returns the last status row.
func (c *Cluster) WaitProbedBy(remote, node, driver string, timeout time.Duration) statusapi.Connection {
	c.m.T.Helper()
	var row statusapi.Connection
	err := WaitFor(timeout, 200*time.Millisecond, func() (bool, string) {
		st, err := c.Status()
		if err != nil {
			return false, err.Error()
		}
		var ok bool
		if row, ok = ConnectionTo(st, remote); !ok {
			return false, fmt.Sprintf("no connection to %s: %+v", remote, st.Connections)
		}
		h := row.Health
		return row.Node == node && row.Driver == driver && row.State == "connected" && h != nil && h.Probing && h.Healthy && h.LastSuccess != nil,
			fmt.Sprintf("%+v (health %+v)", row, h)
	})
	if err != nil {
		c.m.T.Fatalf("%s's connection to %s never went to %s over %s with answered probes: %v", c.Node, remote, node, driver, err)
	}
	return row
}
