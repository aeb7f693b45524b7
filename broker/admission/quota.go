package admission

import (
	"fmt"
	"slices"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// ExportQuota bounds what the nodes of one cluster export together, so that no cluster can fill
// the importing nodes' load balancer maps (bpf.DefaultServiceMapEntries entries each) alone.
// A field of 0 takes its default.
type ExportQuota struct {
	// Services bounds the services (namespace/name) the cluster exports. Default 512.
	Services int
	// Endpoints bounds the endpoints of all the cluster's exports. Default 32,768.
	Endpoints int
	// ServiceMapEntries bounds the importers' service map entries the cluster's exports need:
	// for each export, its ports x (its endpoints + one per VIP family), the VIP x port entry and
	// one backend slot per endpoint. Default 32,768: half of an importer's service map, so two
	// clusters at their quota fill it (see docs/limits.md).
	ServiceMapEntries int
}

// The defaults of ExportQuota.
const (
	DefaultQuotaServices          = 512
	DefaultQuotaEndpoints         = 32768
	DefaultQuotaServiceMapEntries = 32768
)

// WithDefaults fills the fields left 0.
func (q ExportQuota) WithDefaults() ExportQuota {
	if q.Services == 0 {
		q.Services = DefaultQuotaServices
	}
	if q.Endpoints == 0 {
		q.Endpoints = DefaultQuotaEndpoints
	}
	if q.ServiceMapEntries == 0 {
		q.ServiceMapEntries = DefaultQuotaServiceMapEntries
	}
	return q
}

// Validate refuses a negative quota.
func (q ExportQuota) Validate() error {
	for _, f := range []struct {
		name string
		n    int
	}{{"services", q.Services}, {"endpoints", q.Endpoints}, {"service map entries", q.ServiceMapEntries}} {
		if f.n < 0 {
			return fmt.Errorf("export quota: %s %d is negative", f.name, f.n)
		}
	}
	return nil
}

// exportUsage is what a cluster's exports count against its quota.
type exportUsage struct {
	services, endpoints, entries int
}

func usageOf(exports []*apiv1.ServiceExport, families int) exportUsage {
	var u exportUsage
	seen := map[string]bool{}
	for _, e := range exports {
		if k := mcs.Key(e.GetNamespace(), e.GetName()); !seen[k] {
			seen[k] = true
			u.services++
		}
		n := len(e.GetEndpoints())
		u.endpoints += n
		if e.GetType() != mcs.TypeHeadless {
			u.entries += len(e.GetPorts()) * (n + families)
		}
	}
	return u
}

// CheckExportQuota refuses (*InvalidError naming the quota, the value and the limit) a
// SetExports of a node of cluster that would leave the cluster's exports over q: mine are the
// node's exports once written, all every stored export of the mesh (the node's old ones among
// them), families the number of VIP ranges (a service has one VIP x port entry per family). A
// request that does not add to a count already over its limit (the quota was lowered since, or
// the node withdraws some exports) is accepted: it moves the cluster toward its quota.
func CheckExportQuota(cluster, node string, mine, all []*apiv1.ServiceExport, families int, q ExportQuota) error {
	q = q.WithDefaults()
	var before, others []*apiv1.ServiceExport
	for _, e := range all {
		if e.GetCluster() != cluster {
			continue
		}
		before = append(before, e)
		if e.GetNode() != node {
			others = append(others, e)
		}
	}
	was := usageOf(before, families)
	now := usageOf(slices.Concat(others, mine), families)
	for _, c := range []struct {
		field      string
		now, was   int
		limit      int
		what, flag string
	}{
		{"exports", now.services, was.services, q.Services, "services", "--max-services-per-cluster"},
		{"exports", now.endpoints, was.endpoints, q.Endpoints, "endpoints", "--max-endpoints-per-cluster"},
		{"exports", now.entries, was.entries, q.ServiceMapEntries, "load balancer service map entries (ports x (endpoints + VIPs))", "--max-service-map-entries-per-cluster"},
	} {
		if c.now > c.limit && c.now > c.was {
			return invalidf(c.field, fmt.Sprint(c.now), "exports: cluster %s would export %d %s, at most %d per cluster (the broker's %s)",
				cluster, c.now, c.what, c.limit, c.flag)
		}
	}
	return nil
}
