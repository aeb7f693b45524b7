package broker

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
)

// vipRanges checks configured VIP ranges by the rules of --service-vip-range (mcs.ParseVIPRanges),
// and gives mcs.DefaultVIPRange for none.
func vipRanges(rs []netip.Prefix) ([]netip.Prefix, error) {
	s := mcs.DefaultVIPRange
	if len(rs) > 0 {
		parts := make([]string, len(rs))
		for i, r := range rs {
			parts[i] = r.String()
		}
		s = strings.Join(parts, ",")
	}
	out, err := mcs.ParseVIPRanges(s)
	if err != nil {
		return nil, fmt.Errorf("service VIP ranges: %w", err)
	}
	return out, nil
}

// reconcileServiceVIPs brings the VIP records in line with the exports and the configured ranges
// at start: a service without a VIP of a configured family gets one (a range was added), a VIP
// record without exports is released, and a VIP outside the ranges (they changed) is kept, with
// a warning, rather than renumbering a live service. A range too full to give every service an
// address is logged, not fatal: the services keep what they have.
func (s *Server) reconcileServiceVIPs(ctx context.Context) error {
	var (
		outside  []string
		plan     admission.VIPPlan
		allocErr error
	)
	_, err := s.store.Update(ctx, func(tx store.Tx) error {
		exports, err := tx.ServiceExports()
		if err != nil {
			return err
		}
		vips, err := tx.ServiceVIPs()
		if err != nil {
			return err
		}
		outside = admission.VIPsOutsideRanges(vips, s.cfg.ServiceVIPRanges)
		plan = admission.VIPPlan{Release: admission.ReleaseVIPs(exports, vips)}
		if plan.Allocate, allocErr = admission.AllocateVIPs(exports, vips, s.cfg.ServiceVIPRanges, s.cfg.Now()); allocErr != nil {
			plan.Allocate = nil
		}
		return s.applyVIPPlan(tx, plan)
	})
	if err != nil {
		return fmt.Errorf("reconcile service VIPs at start: %w", err)
	}
	for _, o := range outside {
		service, vip, _ := strings.Cut(o, " ")
		s.log.Warn("service VIP lies outside --service-vip-range; kept, not renumbered (it is released when the service's last export goes)",
			"service", service, "vip", vip, "ranges", fmt.Sprint(s.cfg.ServiceVIPRanges))
	}
	if allocErr != nil {
		s.log.Error("allocate service VIPs at start", "err", allocErr)
	}
	s.logVIPPlan(plan)
	return nil
}

// applyVIPPlan writes plan in tx.
func (s *Server) applyVIPPlan(tx store.Tx, plan admission.VIPPlan) error {
	for _, v := range plan.Allocate {
		if err := tx.PutServiceVIP(v); err != nil {
			return err
		}
	}
	for _, v := range plan.Release {
		if err := tx.DeleteServiceVIP(v.Namespace, v.Name); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) logVIPPlan(plan admission.VIPPlan) {
	for _, v := range plan.Allocate {
		s.log.Info("service VIP allocated", "service", mcs.Key(v.Namespace, v.Name), "vips", strings.Join(v.Vips, ","))
	}
	for _, v := range plan.Release {
		s.log.Info("service VIP released", "service", mcs.Key(v.Namespace, v.Name), "vips", strings.Join(v.Vips, ","))
	}
}

// SetExports replaces every export of the calling node (the cluster and node of its certificate)
// and, in the same transaction, allocates the VIPs of services exported for the first time and
// releases those of services no export is left of. An unchanged set writes nothing.
func (a *agentService) SetExports(ctx context.Context, req *apiv1.SetExportsRequest) (*apiv1.SetExportsResponse, error) {
	id := identityFrom(ctx)
	now := a.s.cfg.Now()
	var (
		plan admission.ExportPlan
		resp *apiv1.SetExportsResponse
	)
	decide := func(tx store.ReadTx) error {
		if err := a.s.stillGood(tx, id); err != nil {
			return err
		}
		c, err := tx.Cluster(id.Cluster)
		if err != nil {
			return err
		}
		all, err := tx.ServiceExports()
		if err != nil {
			return err
		}
		vips, err := tx.ServiceVIPs()
		if err != nil {
			return err
		}
		if plan, err = admission.PlanExports(id, c, req.GetExports(), all, vips, a.s.cfg.ServiceVIPRanges, now); err != nil {
			return err
		}
		if err = admission.CheckExportQuota(id.Cluster, id.Node, plan.Exports, all, len(a.s.cfg.ServiceVIPRanges), a.s.cfg.ExportQuota); err != nil {
			return err
		}
		return admission.CheckExportScope(c, req.GetExports(), func() ([]string, error) { return clusterMeshAddresses(tx, id.Cluster) })
	}
	// Every agent sends its exports on every new stream, mostly the ones the broker has: those
	// are answered from a read (a linearizable one on etcd), not queued behind the writes of a
	// fleet that starts at once.
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		if err := decide(tx); err != nil || !plan.Empty() {
			return err
		}
		var err error
		resp, err = exportsResponse(tx, id.Cluster, plan.Exports)
		return err
	})
	if err != nil {
		return nil, rpcError("set exports", err)
	}
	if resp != nil {
		return resp, nil
	}
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		if err := decide(tx); err != nil {
			return err
		}
		for _, e := range plan.Put {
			if err := tx.PutServiceExport(e); err != nil {
				return err
			}
		}
		for _, e := range plan.Delete {
			if err := tx.DeleteServiceExport(e.Cluster, e.Node, e.Namespace, e.Name); err != nil {
				return err
			}
		}
		if err := a.s.applyVIPPlan(tx, plan.VIPs); err != nil {
			return err
		}
		resp, err = exportsResponse(tx, id.Cluster, plan.Exports)
		return err
	})
	if err != nil {
		return nil, rpcError("set exports", err)
	}
	if !plan.Empty() {
		a.s.log.Info("service exports set", "cluster", id.Cluster, "node", id.Node, "exports", len(plan.Exports),
			"changed", len(plan.Put), "withdrawn", len(plan.Delete), "conflicts", len(resp.Conflicts), "revision", resp.Revision)
		a.s.logVIPPlan(plan.VIPs)
	}
	return resp, nil
}

// exportsResponse answers SetExports of cluster from tx once the plan is written: the node's
// exports as stored (their revisions stamped), the conflicts of cluster's exports, and the
// revision. Only the services cluster exports are merged.
func exportsResponse(tx store.ReadTx, cluster string, mine []*apiv1.ServiceExport) (*apiv1.SetExportsResponse, error) {
	resp := &apiv1.SetExportsResponse{Revision: tx.Revision(), Exports: []*apiv1.ServiceExport{}}
	for _, e := range mine {
		stored, err := tx.ServiceExport(e.Cluster, e.Node, e.Namespace, e.Name)
		if err != nil {
			return nil, err
		}
		if stored == nil {
			return nil, fmt.Errorf("export %s was not stored", store.ServiceExportKey(e.Cluster, e.Node, e.Namespace, e.Name))
		}
		resp.Exports = append(resp.Exports, stored)
	}
	all, err := tx.ServiceExports()
	if err != nil {
		return nil, err
	}
	exported := map[string]bool{}
	for _, e := range all {
		if e.Cluster == cluster {
			exported[mcs.Key(e.Namespace, e.Name)] = true
		}
	}
	var relevant []*apiv1.ServiceExport
	for _, e := range all {
		if exported[mcs.Key(e.Namespace, e.Name)] {
			relevant = append(relevant, e)
		}
	}
	clusters, err := tx.Clusters()
	if err != nil {
		return nil, err
	}
	vips, err := tx.ServiceVIPs()
	if err != nil {
		return nil, err
	}
	resp.Conflicts = mcs.ConflictsOf(cluster, mcs.Merge(relevant, admission.ClusterIDs(clusters), admission.VIPMap(vips)))
	return resp, nil
}

// ListServices returns every service import, unfiltered and with its conflicts, and every export.
func (a *adminService) ListServices(ctx context.Context, _ *apiv1.ListServicesRequest) (*apiv1.ListServicesResponse, error) {
	resp := &apiv1.ListServicesResponse{}
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		if resp.Exports, err = tx.ServiceExports(); err != nil {
			return err
		}
		clusters, err := tx.Clusters()
		if err != nil {
			return err
		}
		vips, err := tx.ServiceVIPs()
		if err != nil {
			return err
		}
		// The ingresses, as watchers get them (importState.view), for cablectl service describe.
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		mesh := map[string]string{}
		for _, e := range eps {
			if e.MeshAddress != "" {
				mesh[store.EndpointKey(e.Cluster, e.Node)] = e.MeshAddress
			}
		}
		// The imports as watchers get them: without endpoints outside their cluster's scope.
		served, outOfScope := exportsInScope(resp.Exports, clustersByName(clusters), mesh)
		resp.Imports = mcs.Merge(served, admission.ClusterIDs(clusters), admission.VIPMap(vips))
		byService := map[string][]*apiv1.ServiceExport{}
		for _, e := range resp.Exports {
			k := mcs.Key(e.Namespace, e.Name)
			byService[k] = append(byService[k], e)
		}
		for _, imp := range resp.Imports {
			addIngresses(imp, byService[mcs.Key(imp.Namespace, imp.Name)], mesh)
			addScopeConflicts(imp, outOfScope[mcs.Key(imp.Namespace, imp.Name)])
		}
		resp.Revision = tx.Revision()
		return nil
	})
	if err != nil {
		return nil, rpcError("list services", err)
	}
	return resp, nil
}
