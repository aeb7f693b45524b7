package admission

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// quotaExports are n exports of cluster/node, each with one port and eps endpoints.
func quotaExports(cluster, node, prefix string, n, eps int) []*apiv1.ServiceExport {
	var out []*apiv1.ServiceExport
	for i := range n {
		e := &apiv1.ServiceExport{Cluster: cluster, Node: node, Namespace: "ns", Name: fmt.Sprintf("%s%d", prefix, i),
			Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}}}
		for j := range eps {
			e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.1.%d.%d", i%250, j%250+1), Ready: true})
		}
		out = append(out, e)
	}
	return out
}

func TestCheckExportQuota(t *testing.T) {
	q := ExportQuota{Services: 10, Endpoints: 100, ServiceMapEntries: 80}
	tests := []struct {
		name     string
		mine     []*apiv1.ServiceExport
		stored   []*apiv1.ServiceExport
		families int
		refusal  string // "" when accepted
	}{
		{name: "within every quota", mine: quotaExports("east", "gw", "a", 5, 10), families: 1},
		{name: "too many services", mine: quotaExports("east", "gw", "a", 11, 0), families: 1, refusal: "11 services, at most 10 per cluster (the broker's --max-services-per-cluster)"},
		{name: "the node's services count with the other nodes' of its cluster",
			mine: quotaExports("east", "gw", "a", 6, 0), stored: quotaExports("east", "gw2", "b", 5, 0), families: 1, refusal: "11 services"},
		{name: "a service exported by two nodes counts once",
			mine: quotaExports("east", "gw", "a", 6, 0), stored: quotaExports("east", "gw2", "a", 6, 0), families: 1},
		{name: "another cluster's exports do not count",
			mine: quotaExports("east", "gw", "a", 6, 0), stored: quotaExports("west", "gw", "b", 9, 0), families: 1},
		{name: "too many endpoints", mine: quotaExports("east", "gw", "a", 2, 51), families: 1, refusal: "102 endpoints, at most 100"},
		{name: "too many map entries: ports x (endpoints + VIPs)", mine: quotaExports("east", "gw", "a", 2, 40), families: 1, refusal: "82 load balancer service map entries"},
		{name: "a dual-stack mesh counts a VIP x port entry per family", mine: quotaExports("east", "gw", "a", 2, 39), families: 2, refusal: "82 load balancer"},
		{name: "the node's own stored exports are replaced, not added",
			mine: quotaExports("east", "gw", "a", 8, 0), stored: quotaExports("east", "gw", "b", 8, 0), families: 1},
		{name: "a withdrawal that leaves the cluster over a lowered quota is accepted",
			mine: quotaExports("east", "gw", "a", 12, 0), stored: quotaExports("east", "gw", "a", 14, 0), families: 1},
		{name: "growing while over it is not",
			mine: quotaExports("east", "gw", "a", 13, 0), stored: quotaExports("east", "gw", "a", 12, 0), families: 1, refusal: "13 services"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckExportQuota("east", "gw", tt.mine, tt.stored, tt.families, q)
			if tt.refusal == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "exports" || inv.Value == "" || !strings.Contains(err.Error(), tt.refusal) || !strings.Contains(err.Error(), "cluster east") {
				t.Fatalf("err %v, want an InvalidError on exports saying %q", err, tt.refusal)
			}
		})
	}
}

func TestExportQuotaDefaults(t *testing.T) {
	q := ExportQuota{}.WithDefaults()
	if q.Services != DefaultQuotaServices || q.Endpoints != DefaultQuotaEndpoints || q.ServiceMapEntries != DefaultQuotaServiceMapEntries {
		t.Fatalf("defaults %+v", q)
	}
	if err := (ExportQuota{Services: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "services -1") {
		t.Errorf("negative quota: %v", err)
	}
}

// The limits agree with the importers' maps: one cluster at its default quota fills at most half
// of an importer's service map (65,536 entries, bpf.DefaultServiceMapEntries; the admission
// package does not load bpf), and the bulk export (512 exports of 128 endpoints, within
// the per-node limits) is refused by the quota of one cluster instead of filling every map.
func TestDefaultQuotaFitsTheImportersMaps(t *testing.T) {
	const importerServiceMap, importerBackendMap = 65536, 65536
	if DefaultQuotaServiceMapEntries*2 > importerServiceMap {
		t.Errorf("two clusters at their quota need %d service map entries, an importer holds %d", DefaultQuotaServiceMapEntries*2, importerServiceMap)
	}
	if DefaultQuotaEndpoints*2 > importerBackendMap {
		t.Errorf("two clusters at their quota need %d backend entries, an importer holds %d", DefaultQuotaEndpoints*2, importerBackendMap)
	}
	bulk := quotaExports("east", "gw", "a", MaxExportsPerNode, 128)
	err := CheckExportQuota("east", "gw", bulk, nil, 1, ExportQuota{})
	if err == nil || !strings.Contains(err.Error(), "65536 endpoints, at most 32768") {
		t.Fatalf("512 x 128 endpoints: %v", err)
	}
	// The most a cluster may export at the default quota, with one port each: 256 services of
	// 127 endpoints, 32,768 entries.
	if err := CheckExportQuota("east", "gw", quotaExports("east", "gw", "a", 256, 127), nil, 1, ExportQuota{}); err != nil {
		t.Fatalf("256 x 127 endpoints: %v", err)
	}
}
