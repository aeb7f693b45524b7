package dashboard

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

// CertWarnBefore is how long before a certificate's expiry the clusters page warns about it.
// Agents renew their certificates on their own well before; one this close was not renewed.
const CertWarnBefore = 30 * 24 * time.Hour

// MaxPairsListed bounds each policy's decides and loses lists: in a mesh of 255 clusters a
// policy can decide 32,385 pairs, which no page lists; its status still counts them all.
const MaxPairsListed = 200

// Inputs is what one poll read from the broker. Certs may be nil (not read this time).
type Inputs struct {
	Clusters *apiv1.ListClustersResponse
	Policies *apiv1.ListPoliciesResponse
	Services *apiv1.ListServicesResponse
	Certs    *apiv1.ListCertificatesResponse
	Links    []Link
}

// pairKey is a cluster pair, the smaller name first.
type pairKey [2]string

func keyOf(a, b string) pairKey {
	if a > b {
		a, b = b, a
	}
	return pairKey{a, b}
}

// Explanations are the policy package's explanation of every cluster pair, keyed by pair.
type Explanations map[pairKey]policy.Explanation

// Explain asks the policy package, as `cablectl connection-policy explain` asks the broker, for
// the decision on every pair of the listed clusters and each covering policy's outcome. It is the
// costly part of a build (O(clusters²)); the poller calls it only when the policies or the
// clusters' labels changed.
func Explain(clusters *apiv1.ListClustersResponse, policies *apiv1.ListPoliciesResponse) (Explanations, error) {
	others, def, err := decodeForResolver(policies)
	if err != nil {
		return nil, err
	}
	r := policy.NewResolver(others, def)
	cl := make([]policy.Cluster, 0, len(clusters.GetClusters()))
	for _, c := range clusters.GetClusters() {
		cl = append(cl, policy.Cluster{Name: c.Name, Labels: c.Labels})
	}
	sort.Slice(cl, func(i, j int) bool { return cl[i].Name < cl[j].Name })
	out := make(Explanations, len(cl)*(len(cl)-1)/2)
	for i := range cl {
		for j := i + 1; j < len(cl); j++ {
			out[keyOf(cl[i].Name, cl[j].Name)] = r.Explain(cl[i], cl[j])
		}
	}
	return out, nil
}

// decodeForResolver splits the broker's policies into the default and the others, as the
// broker's own explain does.
func decodeForResolver(resp *apiv1.ListPoliciesResponse) (others []policy.ClusterConnectionPolicy, def policy.ClusterConnectionPolicy, err error) {
	for _, raw := range resp.GetPolicies() {
		p, err := policy.DecodeJSON(raw.Json)
		if err != nil {
			return nil, def, fmt.Errorf("policy %q from the broker: %w", raw.Name, err)
		}
		if raw.IsDefault {
			def = p
			continue
		}
		others = append(others, p)
	}
	return others, def, nil
}

// Fingerprint identifies what Explain depends on: the policies and the clusters (names and
// labels, through their revisions). Equal fingerprints give equal explanations.
func Fingerprint(clusters *apiv1.ListClustersResponse, policies *apiv1.ListPoliciesResponse) string {
	var sb strings.Builder
	for _, c := range clusters.GetClusters() {
		fmt.Fprintf(&sb, "c%s@%d;", c.Name, c.Revision)
	}
	for _, p := range policies.GetPolicies() {
		fmt.Fprintf(&sb, "p%s@%d;", p.Name, p.Revision)
	}
	return sb.String()
}

// Build turns one poll's inputs and the pairs' explanations into the dashboard's document
// (without events: the poller adds those by comparing documents).
func Build(in Inputs, ex Explanations, now time.Time) (Mesh, error) {
	m := Mesh{
		GeneratedAt: now.UTC(),
		Revision:    in.Clusters.GetRevision(),
		Links:       nonNilLinks(in.Links),
		Warnings:    meshWarnings(in.Certs, now),
		Events:      []Event{},
	}
	m.Clusters = buildClusters(in, now)
	m.Pairs = buildPairs(m.Clusters, m.Links, ex)
	pols, err := buildPolicies(in.Policies, ex)
	if err != nil {
		return m, err
	}
	m.Policies = pols
	m.Services = buildServices(in.Services)
	return m, nil
}

func nonNilLinks(ls []Link) []Link {
	if ls == nil {
		return []Link{}
	}
	return ls
}

// buildClusters lists the clusters by name with their gateways: those registered now (online
// while their lease runs) and those the broker holds a mesh address for, registered before.
func buildClusters(in Inputs, now time.Time) []Cluster {
	versions := agentVersions(in.Links)
	certs := map[string]*apiv1.NodeCertificate{}
	for _, n := range in.Certs.GetNodes() {
		certs[n.Cluster+"/"+n.Node] = n
	}
	out := make([]Cluster, 0, len(in.Clusters.GetClusters()))
	for _, c := range in.Clusters.GetClusters() {
		cl := Cluster{Name: c.Name, ID: c.Id, Labels: c.Labels, Mode: policy.ModeDirect, Gateways: []Gateway{}, AgentVersions: []string{}, CertWarnings: []string{}}
		if cl.Labels == nil {
			cl.Labels = map[string]string{}
		}
		if c.GatewayMode {
			cl.Mode = policy.ModeGateway
		}
		seen := map[string]bool{}
		for _, e := range in.Clusters.GetEndpoints() {
			if e.Cluster != c.Name {
				continue
			}
			seen[e.Node] = true
			g := Gateway{Node: e.Node, PrivateIP: e.PrivateIp, MeshAddress: e.MeshAddress, Online: true}
			if e.LeaseExpires != nil {
				g.Online = e.LeaseExpires.AsTime().After(now)
			}
			cl.Gateways = append(cl.Gateways, g)
		}
		for _, n := range in.Certs.GetNodes() {
			if n.Cluster == c.Name && !seen[n.Node] && n.MeshAddress != "" && !n.Revoked {
				cl.Gateways = append(cl.Gateways, Gateway{Node: n.Node, MeshAddress: n.MeshAddress})
			}
		}
		sort.Slice(cl.Gateways, func(i, j int) bool { return cl.Gateways[i].Node < cl.Gateways[j].Node })
		for i := range cl.Gateways {
			g := &cl.Gateways[i]
			g.AgentVersion = versions[c.Name+"/"+g.Node]
			if g.Online {
				cl.GatewaysOnline++
			}
			if g.AgentVersion != "" && !slices.Contains(cl.AgentVersions, g.AgentVersion) {
				cl.AgentVersions = append(cl.AgentVersions, g.AgentVersion)
			}
			if n := certs[c.Name+"/"+g.Node]; n != nil && len(n.Certificates) > 0 && n.Certificates[0].NotAfter != nil {
				t := n.Certificates[0].NotAfter.AsTime()
				g.CertNotAfter = &t
			}
		}
		cl.GatewaysTotal = len(cl.Gateways)
		sort.Strings(cl.AgentVersions)
		cl.CertWarnings = certWarnings(c.Name, in.Certs, now)
		out = append(out, cl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// agentVersions maps "cluster/node" to the agent version its newest link report names.
func agentVersions(links []Link) map[string]string {
	out := map[string]string{}
	newest := map[string]time.Time{}
	for _, l := range links {
		for _, e := range l.Ends {
			if e.AgentVersion == "" {
				continue
			}
			k := e.Cluster + "/" + e.Node
			var at time.Time
			if e.ReportedAt != nil {
				at = *e.ReportedAt
			}
			if _, ok := out[k]; !ok || at.After(newest[k]) {
				out[k], newest[k] = e.AgentVersion, at
			}
		}
	}
	return out
}

// certWarnings names the cluster's nodes whose newest certificate is expired, expires within
// CertWarnBefore, or was issued by a CA the broker trusts only until the end of a rotation.
func certWarnings(cluster string, certs *apiv1.ListCertificatesResponse, now time.Time) []string {
	leaving := map[string]time.Time{}
	for _, ca := range certs.GetCas() {
		if ca.TrustedUntil != nil {
			leaving[ca.Hash] = ca.TrustedUntil.AsTime()
		}
	}
	out := []string{}
	for _, n := range certs.GetNodes() {
		if n.Cluster != cluster || n.Revoked || len(n.Certificates) == 0 {
			continue
		}
		c := n.Certificates[0] // the newest
		if c.NotAfter != nil {
			if w := expiryWarning(c.NotAfter.AsTime(), now); w != "" {
				out = append(out, fmt.Sprintf("node %s: certificate %s", n.Node, w))
			}
		}
		if until, ok := leaving[c.IssuerCa]; ok {
			out = append(out, fmt.Sprintf("node %s: certificate from the previous CA, trusted until %s: renew it", n.Node, until.UTC().Format(time.RFC3339)))
		}
	}
	sort.Strings(out)
	return out
}

// expiryWarning is "expired ..." or "expires in ..." when notAfter is within CertWarnBefore of
// now, else "".
func expiryWarning(notAfter, now time.Time) string {
	switch left := notAfter.Sub(now); {
	case left <= 0:
		return "expired " + notAfter.UTC().Format(time.RFC3339)
	case left < CertWarnBefore:
		return fmt.Sprintf("expires in %s (%s)", roundAge(left), notAfter.UTC().Format(time.RFC3339))
	}
	return ""
}

func roundAge(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	return d.Round(time.Minute).String()
}

// meshWarnings are the CAs' and this dashboard's admin certificate's expiry warnings.
func meshWarnings(certs *apiv1.ListCertificatesResponse, now time.Time) []string {
	out := []string{}
	for _, ca := range certs.GetCas() {
		if ca.NotAfter != nil {
			if w := expiryWarning(ca.NotAfter.AsTime(), now); w != "" {
				out = append(out, fmt.Sprintf("CA %s: %s", ca.Hash, w))
			}
		}
	}
	if a := certs.GetAdmin(); a != nil && a.NotAfter != nil {
		if w := expiryWarning(a.NotAfter.AsTime(), now); w != "" {
			out = append(out, "admin certificate (this dashboard's credential): "+w)
		}
	}
	return out
}

// buildPairs gives every pair of clusters a verdict, by name.
func buildPairs(clusters []Cluster, links []Link, ex Explanations) []Pair {
	byPair := map[pairKey]*Link{}
	for i := range links {
		byPair[keyOf(links[i].Clusters[0], links[i].Clusters[1])] = &links[i]
	}
	out := []Pair{}
	for i := range clusters {
		for j := i + 1; j < len(clusters); j++ {
			a, b := &clusters[i], &clusters[j]
			k := keyOf(a.Name, b.Name)
			e, explained := ex[k]
			out = append(out, pairVerdict(k, e.Decision, explained, a.GatewaysOnline, b.GatewaysOnline, byPair[k]))
		}
	}
	return out
}

// pairVerdict decides a pair's state: what the policies say first (a pair they do not connect
// is none whatever anyone reports), then what the broker knows for sure (a cluster with no
// gateway online cannot be connected), then the link report's two ends.
func pairVerdict(k pairKey, d policy.Decision, explained bool, onlineA, onlineB int, l *Link) Pair {
	p := Pair{Clusters: k, Connect: d.Connect, Driver: d.Driver, Policy: d.Policy}
	switch {
	case !explained:
		p.State, p.Reason = StateUnknown, "the policies could not be resolved"
		return p
	case !d.Connect:
		p.State, p.Reason = StateNone, "the policies do not connect this pair"
		if d.Policy != "" {
			p.Reason += " (policy " + d.Policy + ")"
		}
		return p
	}
	if l != nil {
		reportedEnds(&p, l)
	}
	switch {
	case onlineA == 0 || onlineB == 0:
		p.State, p.Reason = StateDown, "no gateway of "+offlineCluster(k, onlineA)+" is online"
	case l == nil || len(l.Ends) == 0:
		p.State, p.Reason = StateUnknown, "no link report yet"
	default:
		p.State, p.Reason = endsState(l)
	}
	return p
}

func offlineCluster(k pairKey, onlineA int) string {
	if onlineA == 0 {
		return k[0]
	}
	return k[1]
}

// reportedEnds fills the pair's driver, latency and nodes from the ends' reports: the driver
// actually running, the worst p50/p99 of the two ends.
func reportedEnds(p *Pair, l *Link) {
	for _, e := range l.Ends {
		if e.Driver != "" {
			p.Driver = e.Driver
		}
		if e.Node != "" {
			p.Nodes = append(p.Nodes, e.Cluster+"/"+e.Node)
		}
		p.LatencyP50Ms = maxPtr(p.LatencyP50Ms, e.LatencyP50Ms)
		p.LatencyP99Ms = maxPtr(p.LatencyP99Ms, e.LatencyP99Ms)
	}
	sort.Strings(p.Nodes)
}

func maxPtr(a, b *float64) *float64 {
	if a == nil || (b != nil && *b > *a) {
		return b
	}
	return a
}

// endsState reads the link report. A stale end (its gateway stopped reporting) says nothing
// any more: only the fresh ends count. Down when a fresh end says error (or anything but
// connected or connecting), connected when both clusters have a fresh end, every one connected,
// and the ends agree; degraded otherwise.
func endsState(l *Link) (state, reason string) {
	var connecting []string
	fresh := map[string]bool{}
	for _, e := range l.Ends {
		if e.Stale {
			continue
		}
		fresh[e.Cluster] = true
		switch e.State {
		case "connected":
		case "connecting":
			connecting = append(connecting, e.Cluster)
		default:
			return StateDown, fmt.Sprintf("%s reports %s", e.Cluster, orUnknown(e.State))
		}
	}
	var silent []string
	for _, c := range l.Clusters {
		if !fresh[c] {
			silent = append(silent, c)
		}
	}
	switch {
	case len(connecting) > 0:
		return StateDegraded, strings.Join(connecting, " and ") + " still connecting"
	case len(silent) == 2:
		return StateDegraded, "both reports are stale"
	case len(silent) == 1 && l.Stale:
		return StateDegraded, silent[0] + "'s report is stale"
	case len(silent) == 1:
		return StateDegraded, "only " + l.Clusters[0+boolIndex(silent[0] == l.Clusters[0])] + " reports the pair"
	case !l.Agree:
		return StateDegraded, "the two ends disagree"
	}
	return StateConnected, "both ends connected"
}

// boolIndex is 1 for true, 0 for false.
func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

func orUnknown(s string) string {
	if s == "" {
		return "no state"
	}
	return s
}

// buildPolicies lists the policies in the order they apply (highest priority first, the
// default last) with the pairs each decides and loses, read from the explanations.
func buildPolicies(resp *apiv1.ListPoliciesResponse, ex Explanations) ([]Policy, error) {
	out := []Policy{}
	index := map[string]int{}
	for _, raw := range resp.GetPolicies() {
		p, err := policy.DecodeJSON(raw.Json)
		if err != nil {
			return nil, fmt.Errorf("policy %q from the broker: %w", raw.Name, err)
		}
		v := Policy{Name: raw.Name, Origin: p.OriginString(), Priority: p.EffectivePriority(), IsDefault: raw.IsDefault,
			Spec: p.Spec, Decides: []PairOutcome{}, Loses: []PairOutcome{}}
		if len(raw.StatusJson) > 0 {
			if err := json.Unmarshal(raw.StatusJson, &v.Status); err != nil {
				return nil, fmt.Errorf("status of policy %q from the broker: %w", raw.Name, err)
			}
		}
		index[raw.Name] = len(out)
		out = append(out, v)
	}
	keys := make([]pairKey, 0, len(ex))
	for k := range ex {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		addOutcomes(out, index, k, ex[k])
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.IsDefault != b.IsDefault {
			return b.IsDefault
		}
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.Name < b.Name
	})
	return out, nil
}

// addOutcomes files one pair's explanation under each policy it names: the decider's decides,
// every other candidate's loses (agrees, lost conflict, lower priority...).
func addOutcomes(pols []Policy, index map[string]int, k pairKey, e policy.Explanation) {
	decided := false
	for _, c := range e.Candidates {
		i, ok := index[c.Policy]
		if !ok {
			continue
		}
		o := PairOutcome{Clusters: k, Outcome: c.Outcome, Winner: e.Decision.Policy, Connect: c.Connect, Driver: c.Driver}
		list := &pols[i].Loses
		if c.Outcome == "decided" {
			list, decided = &pols[i].Decides, true
		}
		appendBounded(&pols[i], list, o)
	}
	// The default decides the pairs no policy covers; it is no candidate of theirs.
	if !decided && e.Decision.Policy != "" {
		if i, ok := index[e.Decision.Policy]; ok {
			appendBounded(&pols[i], &pols[i].Decides, PairOutcome{Clusters: k, Outcome: "decided", Winner: e.Decision.Policy,
				Connect: e.Decision.Connect, Driver: e.Decision.Driver})
		}
	}
}

func appendBounded(p *Policy, list *[]PairOutcome, o PairOutcome) {
	if len(*list) >= MaxPairsListed {
		p.Truncated = true
		return
	}
	*list = append(*list, o)
}

// buildServices lists the service imports by namespace and name.
func buildServices(resp *apiv1.ListServicesResponse) []Service {
	out := []Service{}
	for _, imp := range resp.GetImports() {
		s := Service{Namespace: imp.Namespace, Name: imp.Name, Type: imp.Type, VIPs: imp.Vips,
			Ports: []ServicePort{}, Exporters: []Exporter{}, Conflicts: []ServiceConflict{}}
		if s.VIPs == nil {
			s.VIPs = []string{}
		}
		for _, p := range imp.Ports {
			s.Ports = append(s.Ports, ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
		}
		for _, c := range imp.Clusters {
			ex := Exporter{Cluster: c.Cluster, Endpoints: len(c.Endpoints)}
			for _, e := range c.Endpoints {
				if e.Ready {
					ex.ReadyEndpoints++
				}
			}
			s.Exporters = append(s.Exporters, ex)
		}
		for _, c := range imp.Conflicts {
			s.Conflicts = append(s.Conflicts, ServiceConflict{Cluster: c.Cluster, Field: c.Field, Message: c.Message})
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}
