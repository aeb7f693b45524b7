package broker

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
	"github.com/cablemesh/cablemesh/policy"
)

// importState is the part of the broker's state that service imports derive from, kept up to date
// from the store's watch batch by batch: clusters (IDs for Merge, labels for the resolver),
// policies, exports and VIPs. It merges the imports per service and re-merges only the services
// a batch touched; it compiles the policies again only when one changed, and resolves a pair
// only when a watcher asks about it. No I/O: the import tracker feeds it and publishes what it
// computes.
type importState struct {
	clusters map[string]*apiv1.Cluster
	policies map[string]*apiv1.Policy
	exports  map[string]map[string]*apiv1.ServiceExport // service → export key → export
	vips     map[string][]string                        // service → VIPs
	// mesh is the mesh address of every live endpoint that has one, by cluster/node: where the
	// node's ingress serves its exports (ImportedCluster.ingresses).
	mesh map[string]string
	// nodeServices are the services each node (cluster/node) exports: those to merge again when
	// its mesh address changes.
	nodeServices map[string]map[string]bool
	merged       map[string]*serviceEntry // service → its import; absent when none
	// labelSets numbers the distinct label sets of the merged imports' clusters, so that a
	// watcher matches its selector once per label set, not once per service and cluster.
	labelSets map[string]int32

	dirty         map[string]bool // services to merge again
	idsChanged    bool            // a cluster came, went or changed ID: merge everything again
	labelsChanged bool            // a cluster came, went or was relabelled
	policyChanged bool            // a policy changed: compile them again

	// Of the last view: shared with it, so replaced, never modified.
	services []*serviceEntry
	labels   map[string]map[string]string // cluster → labels
	resolver *policy.Resolver
	pairs    *pairDecisions // of labels and resolver: shared until either changes
}

func newImportState() *importState {
	s := &importState{}
	s.reset()
	return s
}

func (s *importState) reset() {
	s.clusters = map[string]*apiv1.Cluster{}
	s.policies = map[string]*apiv1.Policy{}
	s.exports = map[string]map[string]*apiv1.ServiceExport{}
	s.vips = map[string][]string{}
	s.mesh = map[string]string{}
	s.nodeServices = map[string]map[string]bool{}
	s.merged = map[string]*serviceEntry{}
	s.labelSets = map[string]int32{}
	s.dirty = map[string]bool{}
	s.idsChanged, s.labelsChanged, s.policyChanged = true, true, true
}

// apply applies one batch of the store's watch (a snapshot replaces everything) and reports
// whether the imports or the pair decisions may have changed.
func (s *importState) apply(b store.Batch) bool {
	if b.Snapshot {
		s.reset()
	}
	changed := b.Snapshot
	for _, ev := range b.Events {
		del := ev.GetType() == apiv1.Event_DELETE
		res := ev.GetResource()
		switch ev.GetKind() {
		case store.KindCluster:
			old := s.clusters[ev.GetKey()]
			if del {
				delete(s.clusters, ev.GetKey())
			} else {
				s.clusters[ev.GetKey()] = res.GetCluster()
			}
			if old == nil || del || old.GetId() != res.GetCluster().GetId() {
				s.idsChanged = true
			} else if scopeChanged(old, res.GetCluster()) {
				s.markClusterDirty(ev.GetKey())
			}
			s.labelsChanged, changed = true, true
		case store.KindPolicy:
			if del {
				delete(s.policies, ev.GetKey())
			} else {
				s.policies[ev.GetKey()] = res.GetPolicy()
			}
			s.policyChanged, changed = true, true
		case store.KindServiceExport:
			svc, ok := serviceOfExportKey(ev.GetKey())
			if !ok {
				continue // not a key the store writes
			}
			node := strings.TrimSuffix(ev.GetKey(), "/"+svc) // cluster/node: a node exports a service once
			if del {
				delete(s.exports[svc], ev.GetKey())
				if len(s.exports[svc]) == 0 {
					delete(s.exports, svc)
				}
				delete(s.nodeServices[node], svc)
				if len(s.nodeServices[node]) == 0 {
					delete(s.nodeServices, node)
				}
			} else {
				if s.exports[svc] == nil {
					s.exports[svc] = map[string]*apiv1.ServiceExport{}
				}
				s.exports[svc][ev.GetKey()] = res.GetServiceExport()
				if s.nodeServices[node] == nil {
					s.nodeServices[node] = map[string]bool{}
				}
				s.nodeServices[node][svc] = true
			}
			s.dirty[svc], changed = true, true
		case store.KindServiceVIP:
			if del {
				delete(s.vips, ev.GetKey())
			} else {
				s.vips[ev.GetKey()] = res.GetServiceVip().GetVips()
			}
			s.dirty[ev.GetKey()], changed = true, true
		case store.KindEndpoint:
			addr := res.GetEndpoint().GetMeshAddress()
			if del {
				addr = ""
			}
			if addr == s.mesh[ev.GetKey()] {
				continue // a change the imports do not show
			}
			if addr == "" {
				delete(s.mesh, ev.GetKey())
			} else {
				s.mesh[ev.GetKey()] = addr
			}
			// The services this node exports show its ingress: merge them again. A snapshot
			// merges everything anyway. In gateway mode the mesh address may be an endpoint of
			// any of its cluster's exports.
			for svc := range s.nodeServices[ev.GetKey()] {
				s.dirty[svc], changed = true, true
			}
			cluster, _, _ := strings.Cut(ev.GetKey(), "/")
			if s.clusters[cluster].GetGatewayMode() && s.markClusterDirty(cluster) {
				changed = true
			}
		}
	}
	return changed
}

// serviceOfExportKey is the namespace/name of an export's key, cluster/node/namespace/name:
// namespace and name are DNS labels, so the last two parts.
func serviceOfExportKey(key string) (string, bool) {
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return "", false
	}
	j := strings.LastIndexByte(key[:i], '/')
	if j < 0 {
		return "", false
	}
	return key[j+1:], true
}

// view computes the imports and pair decisions as of rev from what apply marked, and returns
// them as a read-only view. When the stored policies cannot be resolved (the broker validated
// every one it stored, so this is a bug or a damaged store) the view connects no pair, and the
// error says why.
func (s *importState) view(rev uint64) (*importView, error) {
	var merged int // bytes of the imports merged for this view (encoded)
	if s.idsChanged || len(s.dirty) > 0 {
		ids := map[string]uint32{}
		for n, c := range s.clusters {
			ids[n] = c.GetId()
		}
		todo := s.dirty
		if s.idsChanged {
			// Every entry is made again, so the label sets can be numbered afresh.
			s.labelSets = map[string]int32{}
			todo = map[string]bool{}
			for k := range s.exports {
				todo[k] = true
			}
			for k := range s.merged {
				todo[k] = true
			}
		}
		for k := range todo {
			exps, outOfScope := exportsInScope(slices.Collect(maps.Values(s.exports[k])), s.clusters, s.mesh)
			imps := mcs.Merge(exps, ids, map[string][]string{k: s.vips[k]})
			if len(imps) == 0 {
				delete(s.merged, k)
			} else {
				addIngresses(imps[0], exps, s.mesh)
				addScopeConflicts(imps[0], outOfScope[k])
				s.merged[k] = s.newEntry(imps[0])
				merged += proto.Size(imps[0])
			}
		}
		s.services = make([]*serviceEntry, 0, len(s.merged))
		for _, k := range slices.Sorted(maps.Keys(s.merged)) {
			s.services = append(s.services, s.merged[k])
		}
		s.dirty, s.idsChanged = map[string]bool{}, false
	}
	if s.labelsChanged {
		s.labels = make(map[string]map[string]string, len(s.clusters))
		for n, c := range s.clusters {
			s.labels[n] = c.GetLabels()
		}
		s.labelsChanged = false
		s.pairs = nil
	}
	var err error
	if s.policyChanged {
		s.resolver, err = compilePolicies(slices.Collect(maps.Values(s.policies)))
		s.policyChanged = false
		s.pairs = nil
	}
	if s.pairs == nil {
		s.pairs = &pairDecisions{labels: s.labels, resolver: s.resolver, connect: map[[2]string]bool{}}
	}
	imports := make([]*apiv1.ServiceImport, len(s.services))
	for i, e := range s.services {
		imports[i] = e.imp
	}
	return &importView{rev: rev, imports: imports, services: s.services, pairs: s.pairs,
		labelSets: len(s.labelSets), mergedBytes: merged, tailored: map[string]*tailoredImports{}}, err
}

// addIngresses fills, in imp (just merged from exports, not shared yet), each cluster's
// ingresses: one per exporting node of that cluster that has a live endpoint with a mesh address
// (mesh, by cluster/node) and ports with an ingress port, in node order. Only exports of the
// import's type count, as for the endpoints (mcs.Merge). A gateway-mode importer reaches the
// cluster through one of them.
func addIngresses(imp *apiv1.ServiceImport, exports []*apiv1.ServiceExport, mesh map[string]string) {
	byCluster := map[string][]*apiv1.GatewayIngress{}
	for _, e := range exports {
		addr := mesh[store.EndpointKey(e.GetCluster(), e.GetNode())]
		if addr == "" || e.GetType() != imp.GetType() {
			continue
		}
		var ports []*apiv1.ServicePort
		for _, p := range e.GetPorts() {
			if p.GetIngressPort() > 0 {
				ports = append(ports, &apiv1.ServicePort{Name: p.GetName(), Port: p.GetPort(), Protocol: p.GetProtocol(), IngressPort: p.GetIngressPort()})
			}
		}
		if len(ports) == 0 {
			continue
		}
		slices.SortFunc(ports, func(a, b *apiv1.ServicePort) int {
			return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
		})
		byCluster[e.GetCluster()] = append(byCluster[e.GetCluster()], &apiv1.GatewayIngress{Node: e.GetNode(), MeshAddress: addr, Ports: ports})
	}
	for _, c := range imp.GetClusters() {
		ing := byCluster[c.GetCluster()]
		slices.SortFunc(ing, func(a, b *apiv1.GatewayIngress) int { return cmp.Compare(a.Node, b.Node) })
		c.Ingresses = ing
	}
}

// newEntry makes the entry of a merged import, numbering its clusters' label sets.
func (s *importState) newEntry(imp *apiv1.ServiceImport) *serviceEntry {
	e := &serviceEntry{imp: imp, visible: map[string]*visiblePart{},
		ids: make([]uint32, len(imp.GetClusters())), labelSets: make([]int32, len(imp.GetClusters()))}
	var b strings.Builder
	for i, c := range imp.GetClusters() {
		e.ids[i] = c.GetClusterId()
		b.Reset()
		for _, k := range slices.Sorted(maps.Keys(c.GetLabels())) {
			b.WriteString(k)
			b.WriteByte(0)
			b.WriteString(c.GetLabels()[k])
			b.WriteByte(0)
		}
		n, ok := s.labelSets[b.String()]
		if !ok {
			n = int32(len(s.labelSets))
			s.labelSets[b.String()] = n
		}
		e.labelSets[i] = n
	}
	return e
}

// compilePolicies builds the resolver the broker decides pairs with for policy status
// (ListPolicies resolves every pair with the same resolver over the same policies; policy
// tests hold Resolve and ResolveAll to the same decisions).
func compilePolicies(stored []*apiv1.Policy) (*policy.Resolver, error) {
	slices.SortFunc(stored, func(a, b *apiv1.Policy) int { return cmp.Compare(a.GetName(), b.GetName()) })
	others, def, err := admission.MeshPolicies(stored)
	if err != nil {
		return nil, err
	}
	return policy.NewResolver(others, def), nil
}

// importView is the mesh's service imports and pair decisions as of one revision, shared by
// every watcher. It is read-only but for its caches.
type importView struct {
	rev      uint64
	imports  []*apiv1.ServiceImport // merged over every export, sorted by namespace/name
	services []*serviceEntry        // the same imports, with what each cluster makes of them
	pairs    *pairDecisions         // which clusters the policies connect
	// labelSets is how many label sets the entries number (serviceEntry.labelSets).
	labelSets int
	// mergedBytes is the size (encoded) of the imports this view merged afresh: what it holds
	// beyond the entries it shares with the view before it.
	mergedBytes int

	mu       sync.Mutex
	tailored map[string]*tailoredImports // by cluster and selector
}

// serviceEntry is one service's merged import and the parts of it that watchers were given,
// by which of its clusters they may use. Views share an entry until the service is merged
// again, so a revision that changes one service computes the visible part of that service
// only: the others' parts, and their fingerprints, are reused.
type serviceEntry struct {
	imp *apiv1.ServiceImport
	// By cluster of imp: its ID, and the number of its export labels' set.
	ids       []uint32
	labelSets []int32

	mu      sync.Mutex
	visible map[string]*visiblePart // by kept clusters (indices into imp.Clusters)
}

// visiblePart is mcs.Visible of a service for one set of kept clusters, and its fingerprint.
type visiblePart struct {
	once sync.Once
	imp  *apiv1.ServiceImport
	hash [sha256.Size]byte
}

// tailoredImports is what one cluster with one import selector may use, and its fingerprint.
type tailoredImports struct {
	once        sync.Once
	imports     *apiv1.ServiceImports
	fingerprint [sha256.Size]byte
}

// pairDecisions are the policies' decisions over one set of clusters and labels, made when
// first asked and kept for every view until a cluster or a policy changes.
type pairDecisions struct {
	labels   map[string]map[string]string // the clusters and their labels
	resolver *policy.Resolver             // nil when the policies could not be compiled: nothing connects

	mu      sync.Mutex
	connect map[[2]string]bool // by pair, lower name first
}

// connects says whether the policies connect clusters a and b, both in the mesh.
func (p *pairDecisions) connects(a, b string) bool {
	if a > b {
		a, b = b, a
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.connect[[2]string{a, b}]
	if !ok {
		la, okA := p.labels[a]
		lb, okB := p.labels[b]
		d = p.resolver != nil && okA && okB &&
			p.resolver.Resolve(policy.Cluster{Name: a, Labels: la}, policy.Cluster{Name: b, Labels: lb}).Connect
		p.connect[[2]string{a, b}] = d
	}
	return d
}

// importsFor returns the imports an agent of cluster self with import selector sel (selText
// is its text) may use, computed once per view for each cluster and selector however many
// watchers ask. The result is shared: read it, do not change it.
func (v *importView) importsFor(self, selText string, sel labels.Selector) *tailoredImports {
	key := self + "\x00" + selText
	v.mu.Lock()
	t := v.tailored[key]
	if t == nil {
		t = &tailoredImports{}
		v.tailored[key] = t
	}
	v.mu.Unlock()
	t.once.Do(func() {
		t.imports, t.fingerprint = v.tailor(self, func(c string) bool { return v.pairs.connects(self, c) }, sel)
	})
	return t
}

// tailor is the part of each service that cluster self may use (mcs.Visible: its own cluster and
// the connected ones, admitted by sel) and the fingerprint of the whole set: equal sets, equal
// in every field and order, have equal fingerprints. Whether a cluster is kept is decided once
// per cluster, whether labels are admitted once per label set; a service's part for the same
// kept clusters is computed once for all clusters and views that share its entry.
func (v *importView) tailor(self string, connected func(string) bool, sel labels.Selector) (*apiv1.ServiceImports, [sha256.Size]byte) {
	var (
		out   = &apiv1.ServiceImports{}
		h     = sha256.New()
		kept  = make([]byte, 0, 64)
		near  [256]int8 // by cluster ID (1..255): self or connected (1), not (-1), not known yet (0)
		admit = make([]int8, v.labelSets)
	)
	for _, e := range v.services {
		kept = kept[:0]
		for i, c := range e.imp.GetClusters() {
			var ok bool
			switch id := e.ids[i]; {
			case id >= uint32(len(near)):
				ok = c.GetCluster() == self || connected(c.GetCluster())
			case near[id] == 0:
				ok = c.GetCluster() == self || connected(c.GetCluster())
				near[id] = -1
				if ok {
					near[id] = 1
				}
			default:
				ok = near[id] == 1
			}
			if !ok {
				continue
			}
			switch ls := e.labelSets[i]; admit[ls] {
			case 0:
				admit[ls] = -1
				if sel.Matches(labels.Set(c.GetLabels())) {
					admit[ls] = 1
				}
				ok = admit[ls] == 1
			case -1:
				ok = false
			}
			if ok {
				kept = binary.AppendUvarint(kept, uint64(i))
			}
		}
		if len(kept) == 0 {
			continue
		}
		p := e.part(string(kept), self, connected, sel)
		out.Imports = append(out.Imports, p.imp)
		h.Write(p.hash[:])
	}
	var fp [sha256.Size]byte
	h.Sum(fp[:0])
	return out, fp
}

// part returns the visible part of e for the kept clusters key, computing it once.
func (e *serviceEntry) part(key, self string, connected func(string) bool, sel labels.Selector) *visiblePart {
	e.mu.Lock()
	p := e.visible[key]
	if p == nil {
		p = &visiblePart{}
		e.visible[key] = p
	}
	e.mu.Unlock()
	p.once.Do(func() {
		// Visible keeps exactly the clusters of key: the same rules over the same inputs.
		p.imp = mcs.Visible(e.imp, self, connected, sel)
		p.hash = fingerprint(p.imp)
	})
	return p
}

// fingerprint is the hash of a message's deterministic encoding.
func fingerprint(m proto.Message) [sha256.Size]byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		// A message this process built always marshals; make a failure differ from every set.
		b = fmt.Appendf(nil, "unmarshalable: %v", err)
	}
	return sha256.Sum256(b)
}
