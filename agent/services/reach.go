package services

import "fmt"

// Pair is what this node knows of one remote cluster with a live gateway endpoint.
type Pair struct {
	// Connect is the connection policies' decision; Policy names the deciding policy.
	Connect bool
	Policy  string
	// Problem is why a connecting pair cannot be carried (e.g. a driver missing at either end);
	// empty when none.
	Problem string
	// Probe is the health probes' verdict; nil when the pair is not probed.
	Probe *Probe
	// Device is the connection's state as its driver reports it (connected, connecting, error, or
	// missing when the driver does not have it); empty when unknown (not read, or a non-gateway).
	Device, DeviceMessage string
	// GatewayMode: the pair is in gateway mode (either cluster joined so, or its policy says
	// mode: gateway). Its services are reached through RemoteNode's ingress on its mesh address,
	// never at the remote cluster's pod IPs.
	GatewayMode bool
	// RemoteNode is the remote gateway the pair's cable connects to ("" when unknown: any).
	RemoteNode string
}

// Probe is the health probes' verdict on one pair.
type Probe struct {
	Healthy             bool
	ConsecutiveFailures int
	LastError           string
}

// DeviceMissing is Pair.Device of a wanted connection its driver does not have.
const DeviceMissing = "missing"

// Reachability decides, for a node of cluster local, which clusters' backends it can use now:
// pairs are the remote clusters with a live gateway endpoint (a cluster without one is absent,
// and so not usable); gateway says whether this node carries the connections itself (else it
// routes through its gateway, and only the policy decides). The local cluster is always usable.
func Reachability(local string, gateway bool, pairs map[string]Pair) map[string]Reach {
	out := map[string]Reach{local: {Usable: true, Reason: "local cluster"}}
	for cluster, p := range pairs {
		if cluster == local {
			continue
		}
		r := reachOfPair(gateway, p)
		r.GatewayMode, r.RemoteNode = p.GatewayMode, p.RemoteNode
		out[cluster] = r
	}
	return out
}

func reachOfPair(gateway bool, p Pair) Reach {
	switch {
	case !p.Connect && p.Policy != "":
		return Reach{Reason: fmt.Sprintf("not connected: no-connect by policy %s", p.Policy)}
	case !p.Connect:
		return Reach{Reason: "not connected: no policy connects the pair"}
	case p.Problem != "":
		return Reach{Reason: "connection cannot be made: " + p.Problem}
	case !gateway:
		return Reach{Usable: true, Reason: "through the cluster's gateway"}
	case p.Probe != nil && !p.Probe.Healthy:
		return Reach{Reason: fmt.Sprintf("connection down: health probes failed %d times in a row (last: %s)", p.Probe.ConsecutiveFailures, p.Probe.LastError)}
	case p.Device == "error":
		return Reach{Reason: "connection down: " + p.DeviceMessage}
	case p.Device == DeviceMissing:
		return Reach{Reason: "connection not established: the driver does not have it"}
	case p.Probe != nil:
		return Reach{Usable: true, Reason: "connected, health probes answer"}
	}
	return Reach{Usable: true, Reason: "connected (not probed)"}
}
