package cablectl

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// linkItem is one remote cluster in `cablectl links -o json|yaml`; the keys are a contract.
type linkItem struct {
	Cluster string `json:"cluster"`
	// Alive: the connection is up on the device and, where probed, its probes answer.
	Alive bool `json:"alive"`
	// Services counts the imports this node uses that the cluster exports.
	Services int `json:"services"`
	// Latencies are the probe RTT percentiles through the cable, in ms; null without probes.
	LatencyP50Ms *float64 `json:"latencyP50Ms"`
	LatencyP95Ms *float64 `json:"latencyP95Ms"`
	LatencyP99Ms *float64 `json:"latencyP99Ms"`
}

func newLinksCmd(g *globalFlags) *cobra.Command {
	var socket string
	var timeout time.Duration
	var all bool
	var f *adminFlags
	cmd := &cobra.Command{
		Use:   "links",
		Short: "One line per linked remote cluster: alive, services imported from it, probe latency (from the local agent; --all: the whole mesh, at the broker)",
		Long: "links asks the local cable-agent for its connections, in the manner of `linkerd multicluster gateways`:\n" +
			"CLUSTER, ALIVE (connected on the device and, where probed, its probes answer), NUM_SVC (the imports this\n" +
			"node uses that the cluster exports) and the p50/p95/p99 of the probe round trips through the cable.\n\n" +
			"With --all it asks the broker instead (the admin credential, --config): one row per cluster pair, from the\n" +
			"link reports every gateway sends the broker, with both ends' state, driver and p50/p99, ALIVE (both ends\n" +
			"connected and fresh), the AGE of the older report, and MARK: DISAGREE where the ends differ in state or\n" +
			"driver or one cluster sends no report of the link, STALE where a report is older than the broker's bound\n" +
			"(three report intervals). -o json|yaml gives items[] with clusters, ends[], agree and stale.",
		Example: "  cablectl links\n  cablectl links --socket /run/cablemesh/agent.sock -o json\n  cablectl links --all\n  cablectl links --all -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(g.output); err != nil {
				return err
			}
			if all {
				return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
					links, err := FetchLinksAll(ctx, client)
					if err != nil {
						return err
					}
					return printLinksAll(cmd.OutOrStdout(), g.output, links)
				})
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			s, err := fetchStatus(ctx, socket)
			if err != nil {
				return err
			}
			return printLinks(cmd.OutOrStdout(), g.output, linkItems(s))
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultStatusSocket(), "the agent's status socket (its statusSocket setting); env CABLEMESH_AGENT_SOCKET")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the agent")
	cmd.Flags().BoolVar(&all, "all", false, "the whole mesh: every cluster pair, from the gateways' link reports at the broker (needs the admin credential)")
	f = newAdminFlags(g, cmd)
	return cmd
}

// linkItems turns the status into one item per remote cluster, by name.
func linkItems(s *statusapi.Status) []linkItem {
	svc := map[string]int{}
	if s.Services != nil {
		for _, imp := range s.Services.Imports {
			for _, c := range imp.Clusters {
				if !c.Local {
					svc[c.Cluster]++
				}
			}
		}
	}
	items := []linkItem{}
	for _, c := range s.Connections {
		it := linkItem{Cluster: c.Cluster, Services: svc[c.Cluster]}
		it.Alive = c.State == "connected" && (c.Health == nil || !c.Health.Probing || c.Health.Healthy)
		if c.RTT != nil && c.Health != nil && c.Health.Samples > 0 {
			p50, p95, p99 := c.RTT.P50Ms, c.RTT.P95Ms, c.RTT.P99Ms
			it.LatencyP50Ms, it.LatencyP95Ms, it.LatencyP99Ms = &p50, &p95, &p99
		}
		items = append(items, it)
	}
	sort.Slice(items, func(i, j int) bool { return items[i].Cluster < items[j].Cluster })
	return items
}

func printLinks(w io.Writer, format string, items []linkItem) error {
	if format != "table" {
		return printData(w, format, items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tALIVE\tNUM_SVC\tLATENCY_P50\tLATENCY_P95\tLATENCY_P99")
	for _, it := range items {
		alive := "False"
		if it.Alive {
			alive = "True"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", it.Cluster, alive, strconv.Itoa(it.Services), msOrDash(it.LatencyP50Ms), msOrDash(it.LatencyP95Ms), msOrDash(it.LatencyP99Ms))
	}
	return tw.Flush()
}

func msOrDash(v *float64) string {
	if v == nil {
		return "-"
	}
	return statusMs(*v)
}
