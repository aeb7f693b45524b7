package cablectl

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
)

func newServiceCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "service",
		Aliases: []string{"services", "svc"},
		Short:   "Inspect the mesh's multi-cluster services: imports, clusterset VIPs, conflicts (needs --config)",
		Long: `Clusters export services (the Kubernetes MCS API's ServiceExport); the broker merges the exports
of each namespace/name into one ServiceImport with a clusterset VIP. Where exports disagree
(type, or a port), the oldest export wins and the others are left out with a conflict.
These commands show what the broker holds, unfiltered: which imports an agent uses also
depends on its cluster's connection policies and import selector.`,
	}
	f := newAdminFlags(g, cmd)
	cmd.AddCommand(newServiceListCmd(f), newServiceDescribeCmd(f))
	return cmd
}

// servicePortView is one port of a service.
type servicePortView struct {
	Name     string `json:"name"`
	Port     uint32 `json:"port"`
	Protocol string `json:"protocol"`
	// IngressPort is the exporting gateway's ingress port (gateway mode); per cluster only.
	IngressPort uint32 `json:"ingressPort,omitempty"`
}

// serviceConflictView is one export left out of its import, and why.
type serviceConflictView struct {
	Cluster string `json:"cluster"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

// serviceListItem is one import in `service list -o json|yaml`.
type serviceListItem struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Type      string `json:"type"`
	// VIP is the first clusterset VIP; empty for a headless service (and until one is allocated).
	VIP       string                `json:"vip"`
	VIPs      []string              `json:"vips"`
	Ports     []servicePortView     `json:"ports"`
	Clusters  []string              `json:"clusters"`
	Conflicts []serviceConflictView `json:"conflicts"`
}

func newServiceListCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every service import: type, VIP, ports, the clusters that export it, conflicts",
		Args:  exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.ListServices(ctx, &apiv1.ListServicesRequest{})
				if err != nil {
					return rpcError("list services", err)
				}
				return printServices(cmd.OutOrStdout(), f.output, resp)
			})
		},
	}
}

func serviceItems(resp *apiv1.ListServicesResponse) []serviceListItem {
	items := []serviceListItem{}
	for _, imp := range resp.GetImports() {
		it := serviceListItem{
			Name: imp.GetName(), Namespace: imp.GetNamespace(), Type: imp.GetType(),
			VIPs: nonNil(imp.GetVips()), Ports: portViews(imp.GetPorts()), Clusters: []string{},
			Conflicts: conflictViews(imp.GetConflicts()),
		}
		if len(it.VIPs) > 0 {
			it.VIP = it.VIPs[0]
		}
		for _, c := range imp.GetClusters() {
			it.Clusters = append(it.Clusters, c.GetCluster())
		}
		items = append(items, it)
	}
	slices.SortStableFunc(items, func(a, b serviceListItem) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return items
}

func printServices(w io.Writer, format string, resp *apiv1.ListServicesResponse) error {
	items := serviceItems(resp)
	if format != "table" {
		return printData(w, format, items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tTYPE\tVIP\tPORTS\tCLUSTERS\tCONFLICTS")
	for _, it := range items {
		conflicts := "-"
		if n := len(it.Conflicts); n > 0 {
			conflicts = fmt.Sprint(n)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", it.Namespace, it.Name, it.Type, vipColumn(it.Type, it.VIPs),
			orNone(portsColumn(it.Ports)), orNone(strings.Join(it.Clusters, ",")), conflicts)
	}
	return tw.Flush()
}

// vipColumn is the first VIP, as kubectl's CLUSTER-IP column: None for a headless service,
// <pending> for one whose VIP is not allocated yet.
func vipColumn(typ string, vips []string) string {
	switch {
	case typ == "Headless":
		return "None"
	case len(vips) == 0:
		return "<pending>"
	}
	return vips[0]
}

// portsColumn is name:port/protocol (port/protocol for an unnamed port), with "(ingress N)"
// for a cluster's gateway ingress port, comma-separated.
func portsColumn(ps []servicePortView) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		if p.Name != "" {
			parts[i] = p.Name + ":" + parts[i]
		}
		if p.IngressPort != 0 {
			parts[i] += fmt.Sprintf("(ingress %d)", p.IngressPort)
		}
	}
	return strings.Join(parts, ",")
}

func portViews(ps []*apiv1.ServicePort) []servicePortView {
	out := make([]servicePortView, 0, len(ps))
	for _, p := range ps {
		out = append(out, servicePortView{Name: p.GetName(), Port: p.GetPort(), Protocol: p.GetProtocol(), IngressPort: p.GetIngressPort()})
	}
	return out
}

func conflictViews(cs []*apiv1.ServiceConflict) []serviceConflictView {
	out := make([]serviceConflictView, 0, len(cs))
	for _, c := range cs {
		out = append(out, serviceConflictView{Cluster: c.GetCluster(), Field: c.GetField(), Message: c.GetMessage()})
	}
	return out
}

// ---- describe ----

// serviceDescribeView is `service describe` of one service: the import as the broker merged it,
// and per exporting cluster (its export left out when it conflicts) what it exports.
type serviceDescribeView struct {
	Name      string                `json:"name"`
	Namespace string                `json:"namespace"`
	Type      string                `json:"type"`
	VIPs      []string              `json:"vips"`
	Ports     []servicePortView     `json:"ports"`
	Clusters  []serviceClusterView  `json:"clusters"`
	Conflicts []serviceConflictView `json:"conflicts"`
	// Revision is the broker's revision the view was read at.
	Revision uint64 `json:"revision"`
	// Datapath says where the per-endpoint inLocalMaps come from; empty when describe asked only
	// the broker.
	Datapath string `json:"datapath,omitempty"`
	// LoadBalancerRefused is why the local agent's maps do not hold the service (they are
	// full); set only when describe asked an agent.
	LoadBalancerRefused string `json:"loadBalancerRefused,omitempty"`
}

// serviceClusterView is one exporting cluster's part of a service.
type serviceClusterView struct {
	Name string `json:"name"`
	ID   uint32 `json:"id"`
	// Imported is false when the cluster's export conflicts with the import and is left out.
	Imported  bool                  `json:"imported"`
	Affinity  string                `json:"affinity"`
	Nodes     []string              `json:"nodes"`
	Labels    map[string]string     `json:"labels,omitempty"`
	Ports     []servicePortView     `json:"ports"`
	Endpoints []serviceEndpointView `json:"endpoints"`
	Conflicts []serviceConflictView `json:"conflicts"`
}

type serviceEndpointView struct {
	IP       string `json:"ip"`
	Hostname string `json:"hostname,omitempty"`
	Ready    bool   `json:"ready"`
	// InLocalMaps says whether the local agent's eBPF service maps hold this backend; set only
	// when describe asked an agent (localBackends).
	InLocalMaps *bool `json:"inLocalMaps,omitempty"`
}

// backendKey is one backend as the eBPF service maps key it: its cluster's ID and its address.
type backendKey struct {
	ClusterID uint32
	IP        netip.Addr
}

// localBackends is what the local agent's eBPF service maps hold of one service: the seam for
// the agent-side part of describe (--socket). Source names where it comes from ("agent
// east/gw1"); Held holds every backend programmed for any of the service's VIP ports. A nil
// *localBackends means describe asked only the broker.
type localBackends struct {
	Source string
	Held   map[backendKey]bool
	// Refused is why the agent's maps do not hold the service (they are full); empty when they do.
	Refused string
}

func newServiceDescribeCmd(f *adminFlags) *cobra.Command {
	var namespace, socket string
	cmd := &cobra.Command{
		Use:   "describe NAME [-n NAMESPACE] [--socket AGENT_SOCKET]",
		Short: "Show one service: its VIPs, type and ports, and per exporting cluster its ID, affinity, endpoints and conflicts",
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := validation.ValidateDNSLabel("service name", name); err != nil {
				return usagef("%v", err)
			}
			if err := validation.ValidateDNSLabel("namespace", namespace); err != nil {
				return usagef("--namespace: %v", err)
			}
			if err := checkOutput(f.output); err != nil {
				return err
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				svcs, err := client.ListServices(ctx, &apiv1.ListServicesRequest{})
				if err != nil {
					return rpcError("describe service", err)
				}
				i := slices.IndexFunc(svcs.GetImports(), func(imp *apiv1.ServiceImport) bool {
					return imp.GetNamespace() == namespace && imp.GetName() == name
				})
				if i < 0 {
					return fmt.Errorf("service %s/%s not found: no cluster exports it (see cablectl service list)", namespace, name)
				}
				clusters, err := client.ListClusters(ctx, &apiv1.ListClustersRequest{})
				if err != nil {
					return rpcError("describe service", err)
				}
				ids := map[string]uint32{}
				for _, c := range clusters.GetClusters() {
					ids[c.GetName()] = c.GetId()
				}
				var local *localBackends
				if socket != "" {
					// service_agent.go: what the local agent's eBPF maps hold of the service.
					if local, err = agentBackends(ctx, socket, namespace, name); err != nil {
						return fmt.Errorf("describe service: the local agent: %w", err)
					}
				}
				v := describeService(svcs.GetImports()[i], svcs.GetExports(), ids, svcs.GetRevision(), local)
				return printServiceDescribe(cmd.OutOrStdout(), f.output, v)
			})
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the service")
	cmd.Flags().StringVar(&socket, "socket", "", "also ask the local agent at this status socket which endpoints its eBPF maps hold (inLocalMaps)")
	return cmd
}

// describeService builds the describe view of imp from the broker's exports (every export of the
// mesh; those of imp's namespace/name are used) and cluster IDs, and, when local is not nil,
// marks each endpoint with whether the local agent's maps hold it.
func describeService(imp *apiv1.ServiceImport, exports []*apiv1.ServiceExport, ids map[string]uint32, revision uint64, local *localBackends) serviceDescribeView {
	v := serviceDescribeView{
		Name: imp.GetName(), Namespace: imp.GetNamespace(), Type: imp.GetType(), VIPs: nonNil(imp.GetVips()),
		Ports: portViews(imp.GetPorts()), Clusters: []serviceClusterView{}, Conflicts: conflictViews(imp.GetConflicts()),
		Revision: revision,
	}
	if local != nil {
		v.Datapath, v.LoadBalancerRefused = local.Source, local.Refused
	}
	// The nodes of each cluster that export it, and the exports of conflicting clusters.
	byCluster := map[string][]*apiv1.ServiceExport{}
	for _, e := range exports {
		if e.GetNamespace() == imp.GetNamespace() && e.GetName() == imp.GetName() {
			byCluster[e.GetCluster()] = append(byCluster[e.GetCluster()], e)
		}
	}
	imported := map[string]bool{}
	for _, c := range imp.GetClusters() {
		imported[c.GetCluster()] = true
		cv := serviceClusterView{Name: c.GetCluster(), ID: c.GetClusterId(), Imported: true, Affinity: c.GetAffinity(),
			Labels: c.GetLabels(), Ports: portViews(c.GetPorts()), Endpoints: endpointViews(c.GetClusterId(), c.GetEndpoints(), local)}
		v.Clusters = append(v.Clusters, cv)
	}
	for cluster, es := range byCluster {
		if imported[cluster] {
			continue
		}
		// Left out: show what it exports, its oldest node export first as the broker merges.
		slices.SortFunc(es, func(a, b *apiv1.ServiceExport) int {
			return cmp.Or(a.GetCreated().AsTime().Compare(b.GetCreated().AsTime()), cmp.Compare(a.GetNode(), b.GetNode()))
		})
		var eps []*apiv1.ServiceEndpoint
		seen := map[string]bool{}
		for _, e := range es {
			for _, ep := range e.GetEndpoints() {
				if !seen[ep.GetIp()] {
					seen[ep.GetIp()] = true
					eps = append(eps, ep)
				}
			}
		}
		slices.SortFunc(eps, func(a, b *apiv1.ServiceEndpoint) int { return compareIPs(a.GetIp(), b.GetIp()) })
		v.Clusters = append(v.Clusters, serviceClusterView{Name: cluster, ID: ids[cluster], Affinity: es[0].GetAffinity(),
			Labels: es[0].GetLabels(), Ports: portViews(es[0].GetPorts()), Endpoints: endpointViews(ids[cluster], eps, local)})
	}
	slices.SortFunc(v.Clusters, func(a, b serviceClusterView) int { return cmp.Compare(a.Name, b.Name) })
	for i := range v.Clusters {
		c := &v.Clusters[i]
		c.Nodes = []string{}
		for _, e := range byCluster[c.Name] {
			c.Nodes = append(c.Nodes, e.GetNode())
		}
		slices.Sort(c.Nodes)
		c.Conflicts = []serviceConflictView{}
		for _, cf := range v.Conflicts {
			if cf.Cluster == c.Name {
				c.Conflicts = append(c.Conflicts, cf)
			}
		}
	}
	return v
}

func endpointViews(clusterID uint32, eps []*apiv1.ServiceEndpoint, local *localBackends) []serviceEndpointView {
	out := make([]serviceEndpointView, 0, len(eps))
	for _, ep := range eps {
		ev := serviceEndpointView{IP: ep.GetIp(), Hostname: ep.GetHostname(), Ready: ep.GetReady()}
		if local != nil {
			a, _ := netip.ParseAddr(ep.GetIp())
			held := local.Held[backendKey{ClusterID: clusterID, IP: a}]
			ev.InLocalMaps = &held
		}
		out = append(out, ev)
	}
	return out
}

func compareIPs(a, b string) int {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	if errX != nil || errY != nil {
		return cmp.Compare(a, b)
	}
	return x.Compare(y)
}

func printServiceDescribe(w io.Writer, format string, v serviceDescribeView) error {
	if format != "table" {
		return printData(w, format, v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintf(tw, "Name:\t%s\n", v.Name)
	fmt.Fprintf(tw, "Namespace:\t%s\n", v.Namespace)
	fmt.Fprintf(tw, "Type:\t%s\n", v.Type)
	vips := strings.Join(v.VIPs, ",")
	if v.Type == "Headless" {
		vips = "None"
	}
	fmt.Fprintf(tw, "VIPs:\t%s\n", orNone(vips))
	fmt.Fprintf(tw, "Ports:\t%s\n", orNone(portsColumn(v.Ports)))
	fmt.Fprintf(tw, "Revision:\t%d\n", v.Revision)
	if v.Datapath != "" {
		fmt.Fprintf(tw, "Datapath:\t%s\n", v.Datapath)
	}
	if v.LoadBalancerRefused != "" {
		fmt.Fprintf(tw, "Load balancer:\tREFUSED: %s\n", v.LoadBalancerRefused)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nClusters:")
	tw = tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "  CLUSTER\tID\tIMPORTED\tAFFINITY\tNODES\tPORTS\tREADY\tCONFLICTS")
	for _, c := range v.Clusters {
		ready := 0
		for _, ep := range c.Endpoints {
			if ep.Ready {
				ready++
			}
		}
		conflicts := "-"
		if n := len(c.Conflicts); n > 0 {
			conflicts = fmt.Sprint(n)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", c.Name, c.ID, yesNo(c.Imported), c.Affinity,
			orNone(strings.Join(c.Nodes, ",")), orNone(portsColumn(c.Ports)), ready, len(c.Endpoints), conflicts)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nEndpoints:")
	tw = tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	header := "  CLUSTER\tIP\tHOSTNAME\tREADY"
	if v.Datapath != "" {
		header += "\tIN-LOCAL-MAPS"
	}
	fmt.Fprintln(tw, header)
	for _, c := range v.Clusters {
		for _, ep := range c.Endpoints {
			line := fmt.Sprintf("  %s\t%s\t%s\t%s", c.Name, ep.IP, orDash(ep.Hostname), yesNo(ep.Ready))
			if v.Datapath != "" {
				line += "\t" + yesNo(ep.InLocalMaps != nil && *ep.InLocalMaps)
			}
			fmt.Fprintln(tw, line)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(v.Conflicts) == 0 {
		_, err := fmt.Fprintln(w, "\nConflicts: <none>")
		return err
	}
	fmt.Fprintln(w, "\nConflicts:")
	tw = tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "  CLUSTER\tFIELD\tMESSAGE")
	for _, c := range v.Conflicts {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", c.Cluster, c.Field, c.Message)
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
