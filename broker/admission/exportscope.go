package admission

import (
	"fmt"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// CheckExportScope refuses a SetExports request of cluster c (as stored, read in the
// transaction that writes the request) when an endpoint of one of its exports lies outside c's
// pod and service CIDRs (and, in gateway mode, its gateways' mesh addresses): see
// mcs.EndpointScope. The refusal is an *InvalidError naming the field
// (exports[i].endpoints[j].ip), the value and the CIDRs; nothing of the request is written.
// meshAddresses gives c's gateways' mesh addresses; it is called only when c is in gateway mode
// and an endpoint is outside its CIDRs, so that the common case reads no endpoints. A nil c is
// left to PlanExports (it refuses the credential).
func CheckExportScope(c *apiv1.Cluster, req []*apiv1.ServiceExport, meshAddresses func() ([]string, error)) error {
	if c == nil {
		return nil
	}
	scope := mcs.ScopeOf(c, nil)
	meshRead := false
	for i, e := range req {
		for j, ep := range e.GetEndpoints() {
			field := fmt.Sprintf("exports[%d].endpoints[%d].ip", i, j)
			err := scope.Check(field, ep.GetIp())
			if err != nil && scope.GatewayMode && !meshRead {
				mesh, merr := meshAddresses()
				if merr != nil {
					return fmt.Errorf("read cluster %s's mesh addresses: %w", c.GetName(), merr)
				}
				scope, meshRead = mcs.ScopeOf(c, mesh), true
				err = scope.Check(field, ep.GetIp())
			}
			if err != nil {
				return invalid(field, ep.GetIp(), err)
			}
		}
	}
	return nil
}
