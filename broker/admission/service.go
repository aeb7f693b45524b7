package admission

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
)

// ExportPlan is what one node's SetExports writes, in one transaction.
type ExportPlan struct {
	// Exports are the node's exports once the plan is written, in key order: the stored record
	// where nothing changed, the new one otherwise.
	Exports []*apiv1.ServiceExport
	// Put are the new and changed exports; Delete the stored exports of the node that the
	// request no longer lists.
	Put    []*apiv1.ServiceExport
	Delete []*apiv1.ServiceExport
	// VIPs are the VIP records to allocate and to release once Put and Delete are written.
	VIPs VIPPlan
}

// Empty says the plan writes nothing: the node sent the exports it has.
func (p ExportPlan) Empty() bool {
	return len(p.Put) == 0 && len(p.Delete) == 0 && p.VIPs.Empty()
}

// VIPPlan is what changes in the VIP records.
type VIPPlan struct {
	// Allocate are the records to put: new ones for services exported for the first time, and
	// stored ones given an address of a family whose range was configured since.
	Allocate []*apiv1.ServiceVIP
	// Release are the stored records of services no export is left of.
	Release []*apiv1.ServiceVIP
}

// Empty says nothing changes.
func (p VIPPlan) Empty() bool { return len(p.Allocate) == 0 && len(p.Release) == 0 }

// PlanExports decides SetExports of agent id: req replaces every export of id's node. c is id's
// cluster as stored (nil when there is none); all is every stored export of the mesh, vips every
// stored VIP record; ranges are the configured VIP ranges (one per address family).
//
// The cluster and node of every export are id's: an export that names another is refused
// (*ForbiddenError naming it), an empty one is filled in. Each export is validated and defaulted
// by mcs.Normalize as "exports[i]" (*InvalidError), and a namespace/name listed twice is refused.
// An export equal to the stored one of the same key is left as it is (no write, no revision); a
// changed one keeps the stored created time, so the oldest-export rule counts from the first
// export; a new one is created now. Stored exports of the node that req leaves out are deleted.
// Then every service left with an export and without a VIP gets one from each range, and the VIP
// of every service left without an export is released (*ExhaustedError when a range is full).
// A cluster removed or recreated since id's certificate was issued is refused (*CredentialError).
func PlanExports(id pki.Identity, c *apiv1.Cluster, req []*apiv1.ServiceExport, all []*apiv1.ServiceExport, vips []*apiv1.ServiceVIP, ranges []netip.Prefix, now time.Time) (ExportPlan, error) {
	if c == nil || c.Uid != id.ClusterUID {
		return ExportPlan{}, &CredentialError{Cluster: id.Cluster, Err: fmt.Errorf("cluster %q was removed from the mesh", id.Cluster)}
	}
	want, err := admitExports(id, req)
	if err != nil {
		return ExportPlan{}, err
	}
	stored := map[string]*apiv1.ServiceExport{}
	var others []*apiv1.ServiceExport // every export but the node's
	for _, e := range all {
		if e.GetCluster() == id.Cluster && e.GetNode() == id.Node {
			stored[exportKey(e)] = e
		} else {
			others = append(others, e)
		}
	}
	var plan ExportPlan
	for _, e := range want {
		k := exportKey(e)
		old := stored[k]
		switch {
		case old == nil:
			e.Created = timestamppb.New(now)
			plan.Put = append(plan.Put, e)
			plan.Exports = append(plan.Exports, e)
		case sameExport(old, e):
			plan.Exports = append(plan.Exports, old)
		default:
			e.Created = old.Created
			plan.Put = append(plan.Put, e)
			plan.Exports = append(plan.Exports, e)
		}
		delete(stored, k)
	}
	for _, k := range slices.Sorted(maps.Keys(stored)) {
		plan.Delete = append(plan.Delete, stored[k])
	}
	slices.SortFunc(plan.Exports, func(a, b *apiv1.ServiceExport) int { return cmp.Compare(exportKey(a), exportKey(b)) })
	if plan.VIPs, err = PlanVIPs(append(others, plan.Exports...), vips, ranges, now); err != nil {
		return ExportPlan{}, err
	}
	return plan, nil
}

// admitExports checks the ownership of every export of a SetExports request and normalizes a
// copy of each, in request order.
func admitExports(id pki.Identity, req []*apiv1.ServiceExport) ([]*apiv1.ServiceExport, error) {
	if len(req) > MaxExportsPerNode {
		return nil, invalidf("exports", "", "exports: %d exports from one node, at most %d", len(req), MaxExportsPerNode)
	}
	total := 0
	for _, e := range req {
		total += len(e.GetEndpoints())
	}
	if total > MaxExportEndpointsPerSet {
		return nil, invalidf("exports", "", "exports: %d endpoints over all exports of one node, at most %d", total, MaxExportEndpointsPerSet)
	}
	out := make([]*apiv1.ServiceExport, 0, len(req))
	seen := map[string]int{}
	for i, in := range req {
		field := fmt.Sprintf("exports[%d]", i)
		if in == nil {
			return nil, invalidf(field, "", "%s: is empty", field)
		}
		e := proto.Clone(in).(*apiv1.ServiceExport)
		if e.Cluster == "" {
			e.Cluster = id.Cluster
		}
		if e.Node == "" {
			e.Node = id.Node
		}
		if e.Cluster != id.Cluster || e.Node != id.Node {
			target := store.EndpointKey(e.Cluster, e.Node)
			return nil, &ForbiddenError{Caller: id.String(), Target: target,
				Err: fmt.Errorf("%s: %s may export only as its own cluster and node %s, not as %s", field, id, store.EndpointKey(id.Cluster, id.Node), target)}
		}
		if err := mcs.Normalize(field, e); err != nil {
			return nil, invalid(field, mcs.Key(in.GetNamespace(), in.GetName()), err)
		}
		k := mcs.Key(e.Namespace, e.Name)
		if j, dup := seen[k]; dup {
			return nil, invalidf(field, k, "%s: service %s is listed twice (also exports[%d])", field, k, j)
		}
		seen[k] = i
		// What the broker stamps is the broker's: the request's values do not count.
		e.Created, e.Revision = nil, 0
		out = append(out, e)
	}
	return out, nil
}

// sameExport compares what an agent sends: everything but created and the revision.
func sameExport(stored, e *apiv1.ServiceExport) bool {
	a := proto.Clone(stored).(*apiv1.ServiceExport)
	a.Created, a.Revision = nil, 0
	return proto.Equal(a, e)
}

func exportKey(e *apiv1.ServiceExport) string {
	return store.ServiceExportKey(e.GetCluster(), e.GetNode(), e.GetNamespace(), e.GetName())
}

// PlanVIPs decides the VIP records once exports are the mesh's exports: AllocateVIPs and
// ReleaseVIPs together.
func PlanVIPs(exports []*apiv1.ServiceExport, vips []*apiv1.ServiceVIP, ranges []netip.Prefix, now time.Time) (VIPPlan, error) {
	alloc, err := AllocateVIPs(exports, vips, ranges, now)
	if err != nil {
		return VIPPlan{}, err
	}
	return VIPPlan{Allocate: alloc, Release: ReleaseVIPs(exports, vips)}, nil
}

// AllocateVIPs gives every service (namespace/name) of exports an address from each range whose
// address family its VIP record lacks: a new record, allocated now, for a service exported for
// the first time; the stored record with one more address when a range of another family was
// configured since. Addresses are the lowest free in their range (mcs.AllocateVIP), services
// are served in key order, and no address of any stored record is handed out again, whether or
// not it lies in the configured ranges: a VIP outside them is kept (the range changed since), not
// renumbered. A full range refuses the whole plan (*ExhaustedError).
func AllocateVIPs(exports []*apiv1.ServiceExport, vips []*apiv1.ServiceVIP, ranges []netip.Prefix, now time.Time) ([]*apiv1.ServiceVIP, error) {
	byKey := map[string]*apiv1.ServiceVIP{}
	used := map[netip.Addr]bool{}
	for _, v := range vips {
		byKey[mcs.Key(v.GetNamespace(), v.GetName())] = v
		for _, s := range v.GetVips() {
			if a, err := netip.ParseAddr(s); err == nil {
				used[a] = true
			}
		}
	}
	services := map[string]*apiv1.ServiceExport{}
	for _, e := range exports {
		services[mcs.Key(e.GetNamespace(), e.GetName())] = e
	}
	var out []*apiv1.ServiceVIP
	for _, k := range slices.Sorted(maps.Keys(services)) {
		rec := byKey[k]
		var next *apiv1.ServiceVIP
		for _, r := range ranges {
			if rec != nil && hasFamily(rec, r.Addr().Is4()) {
				continue
			}
			a, err := mcs.AllocateVIP(r, used)
			if err != nil {
				return nil, &ExhaustedError{Resource: "service VIP", Err: fmt.Errorf("cannot allocate a VIP for service %s: %w", k, err)}
			}
			used[a] = true
			if next == nil {
				if rec != nil {
					next = proto.Clone(rec).(*apiv1.ServiceVIP)
				} else {
					e := services[k]
					next = &apiv1.ServiceVIP{Namespace: e.GetNamespace(), Name: e.GetName(), Allocated: timestamppb.New(now)}
				}
			}
			next.Vips = append(next.Vips, a.String())
		}
		if next != nil {
			out = append(out, next)
		}
	}
	return out, nil
}

// ReleaseVIPs are the VIP records of vips whose service has no export left in exports, in key
// order.
func ReleaseVIPs(exports []*apiv1.ServiceExport, vips []*apiv1.ServiceVIP) []*apiv1.ServiceVIP {
	exported := map[string]bool{}
	for _, e := range exports {
		exported[mcs.Key(e.GetNamespace(), e.GetName())] = true
	}
	var out []*apiv1.ServiceVIP
	for _, v := range vips {
		if !exported[mcs.Key(v.GetNamespace(), v.GetName())] {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b *apiv1.ServiceVIP) int {
		return cmp.Compare(mcs.Key(a.GetNamespace(), a.GetName()), mcs.Key(b.GetNamespace(), b.GetName()))
	})
	return out
}

func hasFamily(v *apiv1.ServiceVIP, is4 bool) bool {
	return slices.ContainsFunc(v.GetVips(), func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && a.Is4() == is4
	})
}

// VIPsOutsideRanges lists, as "namespace/name VIP", every stored VIP that lies in none of the
// configured ranges: the range changed since it was allocated. The broker keeps serving such a
// VIP (renumbering a live service would break its callers) and warns about it.
func VIPsOutsideRanges(vips []*apiv1.ServiceVIP, ranges []netip.Prefix) []string {
	var out []string
	for _, v := range vips {
		for _, s := range v.GetVips() {
			a, err := netip.ParseAddr(s)
			if err == nil && slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(a) }) {
				continue
			}
			out = append(out, mcs.Key(v.GetNamespace(), v.GetName())+" "+s)
		}
	}
	slices.Sort(out)
	return out
}

// VIPMap is the VIP records as mcs.Merge wants them: namespace/name to addresses.
func VIPMap(vips []*apiv1.ServiceVIP) map[string][]string {
	out := make(map[string][]string, len(vips))
	for _, v := range vips {
		out[mcs.Key(v.GetNamespace(), v.GetName())] = v.GetVips()
	}
	return out
}

// ClusterIDs is the clusters as mcs.Merge wants them: name to ID.
func ClusterIDs(cs []*apiv1.Cluster) map[string]uint32 {
	out := make(map[string]uint32, len(cs))
	for _, c := range cs {
		out[c.GetName()] = c.GetId()
	}
	return out
}

// ExportsWithout is exports without those of cluster.
func ExportsWithout(exports []*apiv1.ServiceExport, cluster string) []*apiv1.ServiceExport {
	return slices.DeleteFunc(slices.Clone(exports), func(e *apiv1.ServiceExport) bool { return e.GetCluster() == cluster })
}
