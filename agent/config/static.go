package config

// Static is the part of the config that a running agent never changes: a reload that changes any
// of these fields is refused whole (Diff). The agent's wiring holds its config as a Static, so
// that reading a live field (joinTokenFile, healthCheck, dns, exports, imports, cableDrivers,
// logLevel) from the start-up config does not compile: the live part is the reloader's snapshot
// of the config in force (reload.Reloader.Live).
type Static struct {
	Cluster, Node, Broker    string
	StateDir, StatusSocket   string
	MetricsAddress           string
	Gateway                  bool
	IngressXDSListen         string // ingress.xds.listen
	KubernetesExportsEnabled bool   // kubernetes.enabled
}

// staticFields are the YAML paths of Static's fields, for the test that none of them is live.
var staticFields = []string{"cluster", "node", "broker", "stateDir", "statusSocket", "metricsAddress", "gateway", "ingress.xds.listen", "kubernetes.enabled"}

// Static is c's static part.
func (c *Config) Static() Static {
	return Static{
		Cluster: c.Cluster, Node: c.Node, Broker: c.Broker, StateDir: c.StateDir, StatusSocket: c.StatusSocket,
		MetricsAddress: c.MetricsAddress, Gateway: c.Gateway, IngressXDSListen: c.Ingress.XDS.Listen,
		KubernetesExportsEnabled: c.Kubernetes.Enabled,
	}
}
