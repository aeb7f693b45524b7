package cablectl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/policy"
)

func newConnectionPolicyCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "connection-policy",
		Aliases: []string{"connection-policies", "ccp"},
		Short:   "Manage ClusterConnectionPolicies: which cluster pairs connect, and over which cable (needs --config)",
		Long: `ClusterConnectionPolicies decide, for every pair of clusters, whether they connect and over
which cable driver. The broker stores them and every agent resolves its own pairs
with them; the mesh default policy "default" decides the pairs no other policy covers.
Policies are also applied from YAML with "cablectl apply -f FILE".`,
	}
	f := newAdminFlags(g, cmd)
	cmd.AddCommand(newPolicyAddCmd(f), newPolicyListCmd(f), newPolicyDeleteCmd(f), newPolicyExportCmd(f), newPolicyExplainCmd(f))
	return cmd
}

func newPolicyAddCmd(f *adminFlags) *cobra.Command {
	var (
		fl       policyFlags
		priority int
		dryRun   bool
	)
	cmd := &cobra.Command{
		Use:   "add --name NAME [flags]",
		Short: "Create a policy from flags, or replace the one of that name",
		Long: `Builds a ClusterConnectionPolicy from the flags and applies it: "created", or "configured" if
a policy of that name existed (it is replaced), or "unchanged".

Selectors take comma-separated terms that must all hold: k=v, k!=v (also matches clusters
without k), "k in (a,b)", "k notin (a,b)", k (exists), !k (does not exist). An empty selector
("") matches every cluster. Use --left-cluster-selector and --right-cluster-selector for two
ends (client-server: left = servers, right = clients), or --cluster-selector for a set.`,
		Example: `  cablectl connection-policy add --name on-prem --left-cluster-selector location=on-premise \
      --right-cluster-selector location=on-premise --cable-driver vxlan --priority 3
  cablectl connection-policy add --name cloud --cluster-selector location=cloud --topology full-mesh \
      --cable-driver vxlan --cable-config vni=200 --priority 3
  cablectl connection-policy add --name db --left-cluster-selector database-role=server \
      --right-cluster-selector database-role=client --topology client-server --priority 3
  cablectl connection-policy add --name no-prod-to-cloud --left-cluster-selector env=production \
      --right-cluster-selector location=cloud --connection-policy no-connect --priority 5`,
		Args: exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fl.Name == "" {
				return usagef("--name is required")
			}
			flags := cmd.Flags()
			if flags.Changed("priority") {
				fl.Priority = &priority
			}
			fl.LeftSet = flags.Changed("left-cluster-selector")
			fl.RightSet = flags.Changed("right-cluster-selector")
			fl.ClusterSet = flags.Changed("cluster-selector")
			p, err := policyFromFlags(fl)
			if err != nil {
				return usagef("%s", oneLine(err))
			}
			return applyPolicies(cmd, f, []policy.ClusterConnectionPolicy{p}, dryRun)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&fl.Name, "name", "", "name of the policy (a DNS label); required")
	fs.StringVar(&fl.LeftClusterSelector, "left-cluster-selector", "", "selector of the clusters at one end (client-server: the servers)")
	fs.StringVar(&fl.RightClusterSelector, "right-cluster-selector", "", "selector of the clusters at the other end (client-server: the clients)")
	fs.StringVar(&fl.ClusterSelector, "cluster-selector", "", "selector of a set of clusters (not with --left/--right-cluster-selector)")
	fs.StringVar(&fl.Topology, "topology", "", "full-mesh | point-to-point | client-server (default: point-to-point with left/right selectors, else full-mesh)")
	fs.IntVar(&priority, "priority", 0, "priority; the covering policies of the highest priority decide a pair")
	fs.StringVar(&fl.ConnectionPolicy, "connection-policy", "", "connect | no-connect (default connect)")
	fs.StringVar(&fl.CableDriver, "cable-driver", "", "cable driver of the connected pairs: wireguard | vxlan | ipsec | vxlan+ipsec (default: the mesh default policy's)")
	fs.StringVar(&fl.CableConfig, "cable-config", "", "cable driver options k=v,k=v (e.g. vxlan: vni=100,port=4789,mtu=1450)")
	fs.BoolVar(&dryRun, "dry-run", false, "have the broker validate and report without storing")
	return cmd
}

// oneLine flattens a joined error (one problem per line) into one line.
func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
}

// policyRow is one policy as the broker lists it, decoded.
type policyRow struct {
	raw    *apiv1.Policy
	p      policy.ClusterConnectionPolicy
	status policy.Status
}

// policyView is the -o json|yaml form of one policy: the policy as it is applied, with its status,
// plus what the broker knows about it.
type policyView struct {
	policy.ClusterConnectionPolicy
	IsDefault bool   `json:"isDefault,omitempty"`
	Revision  uint64 `json:"revision"`
}

type policyListView struct {
	Revision uint64       `json:"revision"`
	Items    []policyView `json:"items"`
}

func decodePolicyRows(resp *apiv1.ListPoliciesResponse) ([]policyRow, error) {
	rows := make([]policyRow, 0, len(resp.Policies))
	for _, raw := range resp.Policies {
		p, err := policy.DecodeJSON(raw.Json)
		if err != nil {
			return nil, fmt.Errorf("policy %q from the broker: %w", raw.Name, err)
		}
		r := policyRow{raw: raw, p: p}
		if len(raw.StatusJson) > 0 {
			if err := json.Unmarshal(raw.StatusJson, &r.status); err != nil {
				return nil, fmt.Errorf("status of policy %q from the broker: %w", raw.Name, err)
			}
			st := r.status
			r.p.Status = &st
		}
		rows = append(rows, r)
	}
	// The order in which policies apply: highest priority first, then by name; the default,
	// which decides only what nothing else covers, last.
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.raw.IsDefault != b.raw.IsDefault {
			return b.raw.IsDefault
		}
		if pa, pb := a.p.EffectivePriority(), b.p.EffectivePriority(); pa != pb {
			return pa > pb
		}
		return a.raw.Name < b.raw.Name
	})
	return rows, nil
}

func (f *adminFlags) listPolicies(cmd *cobra.Command) (*apiv1.ListPoliciesResponse, error) {
	var resp *apiv1.ListPoliciesResponse
	err := f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
		var err error
		if resp, err = client.ListPolicies(ctx, &apiv1.ListPoliciesRequest{}); err != nil {
			return rpcError("list policies", err)
		}
		return nil
	})
	return resp, err
}

func newPolicyListCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the policies, highest priority first, with the pairs each decides and the conflicts it lost",
		Long: `Lists the policies in the order they apply: highest priority first, the mesh default (marked
"(default)") last. PAIRS counts the cluster pairs a policy decides now, CONFLICTS the pairs where
it matched at the deciding priority, disagreed and lost (DESIGN.md: no-connect beats connect,
then the smallest name). DRIVER <default> means the mesh default policy's driver.`,
		Args: exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			resp, err := f.listPolicies(cmd)
			if err != nil {
				return err
			}
			return printPolicies(cmd.OutOrStdout(), f.output, resp)
		},
	}
}

func printPolicies(w io.Writer, format string, resp *apiv1.ListPoliciesResponse) error {
	rows, err := decodePolicyRows(resp)
	if err != nil {
		return err
	}
	if format == "json" || format == "yaml" {
		view := policyListView{Revision: resp.Revision, Items: []policyView{}}
		for _, r := range rows {
			view.Items = append(view.Items, policyView{ClusterConnectionPolicy: r.p, IsDefault: r.raw.IsDefault, Revision: r.raw.Revision})
		}
		return printData(w, format, view)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPRIORITY\tTOPOLOGY\tPOLICY\tDRIVER\tSELECTORS\tPAIRS\tCONFLICTS\tORIGIN")
	for _, r := range rows {
		name := r.raw.Name
		if r.raw.IsDefault {
			name += " (default)"
		}
		conflicts := strconv.Itoa(r.status.ConflictsLost)
		if r.status.Error != "" {
			conflicts = "invalid"
		}
		// "mesh", or "cluster/<name>" for a policy applied in that cluster.
		origin := r.p.OriginString()
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", name, r.p.EffectivePriority(), r.p.Spec.EffectiveTopology(),
			connectionPolicy(r.p.Spec), driverColumn(r.p.Spec), selectorsColumn(r.p.Spec), r.status.PairsDecided, conflicts, origin)
	}
	return tw.Flush()
}

func connectionPolicy(s policy.Spec) string {
	if s.Connects() {
		return policy.Connect
	}
	return policy.NoConnect
}

func driverColumn(s policy.Spec) string {
	switch {
	case !s.Connects():
		return "-"
	case s.CableDriver == nil:
		return "<default>"
	}
	return driverWithOptions(s.CableDriver.Name, s.CableDriver.Options)
}

func driverWithOptions(name string, opts map[string]string) string {
	if len(opts) == 0 {
		return name
	}
	return name + "(" + formatLabels(opts) + ")"
}

// selectorsColumn shows the left/right form as "LEFT <-> RIGHT" and the set form as its selector;
// "*" is a selector that matches every cluster.
func selectorsColumn(s policy.Spec) string {
	sel := func(x *policy.Selector) string {
		if str := x.String(); str != "" {
			return str
		}
		return "*"
	}
	if s.UsesLeftRight() {
		return sel(s.LeftClusterSelector) + " <-> " + sel(s.RightClusterSelector)
	}
	return sel(s.ClusterSelector)
}

func printData(w io.Writer, format string, v any) error {
	var (
		b   []byte
		err error
	)
	if format == "yaml" {
		b, err = yaml.Marshal(v)
	} else {
		b, err = json.MarshalIndent(v, "", "  ")
		b = append(b, '\n')
	}
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// policyNames collects names given with --name and as arguments, checking their form.
func policyNames(flagName string, args []string) ([]string, error) {
	var names []string
	if flagName != "" {
		names = append(names, flagName)
	}
	names = append(names, args...)
	for _, n := range names {
		if err := validation.ValidateClusterName(n); err != nil {
			// Policy names are DNS labels, like cluster names.
			return nil, usagef("policy name %q is not a DNS label (lowercase letters, digits and '-', at most 63)", n)
		}
	}
	return names, nil
}

func newPolicyDeleteCmd(f *adminFlags) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "delete (--name NAME | NAME...)",
		Short: "Delete policies (the mesh default policy cannot be deleted: change it with apply)",
		RunE: func(cmd *cobra.Command, args []string) error {
			names, err := policyNames(name, args)
			if err != nil {
				return err
			}
			if len(names) == 0 {
				return usagef("%s needs the policy's name: --name NAME or NAME", cmd.CommandPath())
			}
			return deletePolicies(cmd, f, names, false)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "name of the policy to delete")
	return cmd
}

func newPolicyExportCmd(f *adminFlags) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "export [--name NAME | NAME...]",
		Short: "Print policies as multi-document YAML that cablectl apply -f reads back",
		Long: `Prints every policy (or the named ones) as multi-document YAML, without status, in the form
"cablectl apply -f" reads: "cablectl connection-policy export > mesh.yaml" backs them up, and
applying that file again reports every policy unchanged. Policies applied in a cluster (ORIGIN
cluster/<name>) are left out unless named: they are changed in their cluster.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			names, err := policyNames(name, args)
			if err != nil {
				return err
			}
			resp, err := f.listPolicies(cmd)
			if err != nil {
				return err
			}
			rows, err := decodePolicyRows(resp)
			if err != nil {
				return err
			}
			byName := map[string]policy.ClusterConnectionPolicy{}
			var all []policy.ClusterConnectionPolicy
			for _, r := range rows {
				r.p.Status = nil
				byName[r.raw.Name] = r.p
				// A cluster's policies are that cluster's to change, and apply refuses
				// them: a backup of the mesh's policies leaves them out.
				if r.p.ClusterOf() == "" {
					all = append(all, r.p)
				}
			}
			if len(names) > 0 {
				all = all[:0]
				var missing []string
				for _, n := range names {
					p, ok := byName[n]
					if !ok {
						missing = append(missing, strconv.Quote(n))
						continue
					}
					all = append(all, p)
				}
				if len(missing) > 0 {
					return fmt.Errorf("export: policy %s not found", strings.Join(missing, ", "))
				}
			}
			b, err := policy.EncodeYAML(all)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "export only this policy")
	return cmd
}

func newPolicyExplainCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "explain CLUSTER_A CLUSTER_B",
		Short: "Show the decision for a pair of clusters and the policy that made it",
		Long: `Resolves the pair with the broker's current policies and cluster labels, exactly as both
agents do, and prints the decision, the policy that made it, and every policy that covered the
pair with what became of it (decided, agrees, lost conflict, lower priority). -o json prints
the explanation as data.`,
		Example: "  cablectl connection-policy explain east west\n  cablectl connection-policy explain east west -o json",
		Args:    exactArgs(2, "CLUSTER_A and CLUSTER_B"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			if err := checkClusterNames(args...); err != nil {
				return err
			}
			if args[0] == args[1] {
				return usagef("%s needs two different clusters, got %q twice", cmd.CommandPath(), args[0])
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.ExplainConnection(ctx, &apiv1.ExplainConnectionRequest{ClusterA: args[0], ClusterB: args[1]})
				if err != nil {
					return rpcError("explain connection", err)
				}
				var e policy.Explanation
				if err := json.Unmarshal(resp.Json, &e); err != nil {
					return fmt.Errorf("explanation from the broker: %w", err)
				}
				if f.output != "table" {
					return printData(cmd.OutOrStdout(), f.output, e)
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), explainLine(args[0], args[1], e))
				return err
			})
		},
	}
}

// explainLine is the one-line form of an explanation, e.g.
// "east <-> west: connect over vxlan (policy on-prem, priority 3); candidates: on-prem (priority 3, connect over vxlan, decided)".
func explainLine(a, b string, e policy.Explanation) string {
	d := e.Decision
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s <-> %s: ", a, b)
	if d.Connect {
		fmt.Fprintf(&sb, "connect over %s", driverWithOptions(d.Driver, d.Options))
	} else {
		sb.WriteString("no connection")
	}
	decided := -1
	for i, c := range e.Candidates {
		if c.Outcome == "decided" {
			decided = i
		}
	}
	switch {
	case d.Policy == "":
		sb.WriteString(" (no policy covers the pair)")
	case decided >= 0:
		kind := "policy"
		if d.Default {
			kind = "default policy"
		}
		fmt.Fprintf(&sb, " (%s %s, priority %d", kind, d.Policy, e.Candidates[decided].Priority)
		if d.Connect && d.Topology == policy.TopologyClientServer && d.Initiator != "" {
			fmt.Fprintf(&sb, ", client-server, %s initiates", d.Initiator)
		}
		sb.WriteString(")")
	default:
		fmt.Fprintf(&sb, " (policy %s)", d.Policy)
	}
	sb.WriteString("; candidates: ")
	if len(e.Candidates) == 0 {
		sb.WriteString("none")
	}
	for i, c := range e.Candidates {
		if i > 0 {
			sb.WriteString(", ")
		}
		verdict := "no connection"
		if c.Connect {
			verdict = "connect over " + c.Driver
		}
		fmt.Fprintf(&sb, "%s (priority %d, %s, %s)", c.Policy, c.Priority, verdict, c.Outcome)
	}
	if len(e.Invalid) > 0 {
		var parts []string
		for _, n := range slices.Sorted(maps.Keys(e.Invalid)) {
			parts = append(parts, n+": "+e.Invalid[n])
		}
		fmt.Fprintf(&sb, "; ignored as invalid: %s", strings.Join(parts, "; "))
	}
	return sb.String()
}
