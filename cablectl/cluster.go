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
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/specs" // the drivers' traits (which one publishes a public key)
	"github.com/cablemesh/cablemesh/policy"
)

// adminTimeout bounds every admin call, so a dead broker fails the command instead of hanging it.
const adminTimeout = 15 * time.Second

// adminFlags are those of every command that talks to the broker with the admin credential.
type adminFlags struct {
	*globalFlags
	broker string // overrides the address in admin.yaml
}

// newAdminFlags adds --broker to cmd (and its subcommands).
func newAdminFlags(g *globalFlags, cmd *cobra.Command) *adminFlags {
	f := &adminFlags{globalFlags: g}
	cmd.PersistentFlags().StringVar(&f.broker, "broker", "", "broker address host:port (replicas: host:port,host:port..., tried in turn), overriding the admin config's")
	return f
}

func newClusterCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Manage the mesh's clusters and join tokens (needs the admin credential, --config)",
	}
	f := newAdminFlags(g, cmd)
	cmd.AddCommand(newJoinTokenCmd(f), newClusterListCmd(f), newClusterLabelCmd(f), newClusterRemoveCmd(f), newRevokeNodeCmd(f), newClusterNodesCmd(f))
	return cmd
}

// withBroker loads the admin credential (--config, with --broker overriding its address), dials
// the broker and runs call with an admin client and a context that ends after adminTimeout. The
// connection is closed when call returns. Every command that talks to the broker goes through it.
func (f *adminFlags) withBroker(cmd *cobra.Command, call func(ctx context.Context, client apiv1.AdminClient) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), adminTimeout)
	defer cancel()
	cfg, err := adminconfig.Load(f.config)
	if err != nil {
		return err
	}
	if f.broker != "" {
		cfg.Broker = f.broker
		if err := cfg.Validate(); err != nil {
			return usagef("--broker: %v", err)
		}
	}
	conn, err := adminconfig.Dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	return call(ctx, apiv1.NewAdminClient(conn))
}

// rpcError turns a gRPC status into a plain message: the broker's messages already say what was
// wrong and with which value.
func rpcError(op string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	if st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded {
		return fmt.Errorf("%s: cannot reach the broker: %s", op, st.Message())
	}
	if st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "message larger than max") {
		// The transport's own refusal: the request as a whole is larger than the broker takes.
		return fmt.Errorf("%s: the request is larger than the broker accepts in one call (%s): send less at once", op,
			strings.TrimPrefix(st.Message(), "grpc: "))
	}
	return fmt.Errorf("%s: %s", op, st.Message())
}

func checkOutput(format string) error {
	switch format {
	case "table", "json", "yaml":
		return nil
	}
	return usagef("--output %q: want table, json or yaml", format)
}

func newJoinTokenCmd(f *adminFlags) *cobra.Command {
	var (
		podCIDRs, svcCIDRs []string
		labels             string
		validFor           time.Duration
		maxNodes           uint32
		gatewayMode        bool
	)
	cmd := &cobra.Command{
		Use:   "join-token NAME --pod-cidr CIDR [--service-cidr CIDR] [--labels k=v,...] [--valid-for 24h] [--max-nodes N] [--gateway-mode]",
		Short: "Create the cluster if it is new and print a join token for one of its nodes",
		Long: `Prints a signed, expiring join token (and nothing else) on stdout. The first token for NAME
creates the cluster with its pod and service CIDRs and labels; later tokens for the same
cluster must give the same CIDRs or none. A pod or service CIDR may not cover the broker's
address, a gateway's address, nor the loopback, link-local, multicast or unspecified ranges.

A token is one-time: it joins one node (--max-nodes N: up to N distinct nodes, e.g. the
gateway nodes of a DaemonSet sharing one token), counted by the broker. A node name that holds
a live certificate cannot be joined again, whatever the token: revoke it first (cluster
revoke-node). Delete the token file once the node has joined.

--gateway-mode creates the cluster in gateway mode: its pairs' cables carry only the gateways'
mesh addresses, services are reached through the remote gateway's ingress, and its pod and
service CIDRs may overlap another gateway-mode cluster's (never a direct one's). A cluster's mode
is fixed when it is created: later tokens for it must give --gateway-mode exactly when it is in
gateway mode.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := checkClusterNames(name); err != nil {
				return err
			}
			pods, err := validation.ParseCIDRs("pod CIDR", podCIDRs)
			if err != nil {
				return usagef("--pod-cidr: %v", err)
			}
			svcs, err := validation.ParseCIDRs("service CIDR", svcCIDRs)
			if err != nil {
				return usagef("--service-cidr: %v", err)
			}
			lbls, err := validation.ParseLabels(labels)
			if err != nil {
				return usagef("--labels: %v", err)
			}
			if validFor <= 0 {
				return usagef("--valid-for %s: must be positive", validFor)
			}
			if validFor%time.Second != 0 {
				return usagef("--valid-for %s: must be whole seconds", validFor)
			}
			if maxNodes < 1 {
				return usagef("--max-nodes %d: a token joins at least one node", maxNodes)
			}
			for _, p := range append(slices.Clone(pods), svcs...) {
				if err := validation.CheckClusterCIDR("CIDR", p); err != nil {
					return usagef("%v", err)
				}
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.CreateJoinToken(ctx, &apiv1.CreateJoinTokenRequest{
					Cluster:         name,
					PodCidrs:        validation.Strings(pods),
					ServiceCidrs:    validation.Strings(svcs),
					Labels:          lbls,
					ValidForSeconds: int64(validFor / time.Second),
					MaxNodes:        maxNodes,
					GatewayMode:     gatewayMode,
				})
				if err != nil {
					return rpcError("create join token", err)
				}
				return printResult(cmd.OutOrStdout(), f.output, resp.Token, map[string]any{"cluster": name, "token": resp.Token})
			})
		},
	}
	cmd.Flags().StringSliceVar(&podCIDRs, "pod-cidr", nil, "pod CIDR of the cluster (repeatable, or a comma list); required for a new cluster")
	cmd.Flags().StringSliceVar(&svcCIDRs, "service-cidr", nil, "service CIDR of the cluster (repeatable, or a comma list)")
	cmd.Flags().StringVar(&labels, "labels", "", "labels of a new cluster, k=v,k2=v2")
	cmd.Flags().DurationVar(&validFor, "valid-for", 24*time.Hour, "how long the token is valid")
	cmd.Flags().Uint32Var(&maxNodes, "max-nodes", 1, "how many distinct nodes the token may join")
	cmd.Flags().BoolVar(&gatewayMode, "gateway-mode", false, "create the cluster in gateway mode (its CIDRs may overlap other gateway-mode clusters'); later tokens must give it too")
	return cmd
}

// clusterView is the -o json|yaml form of one cluster.
type clusterView struct {
	Name         string            `json:"name"`
	ID           uint32            `json:"id"`
	UID          string            `json:"uid"`
	Labels       map[string]string `json:"labels,omitempty"`
	PodCIDRs     []string          `json:"podCIDRs"`
	ServiceCIDRs []string          `json:"serviceCIDRs"`
	// GatewayMode: the cluster joined in gateway mode (MODE gateway in the table; else direct).
	GatewayMode bool          `json:"gatewayMode"`
	JoinedAt    *time.Time    `json:"joinedAt,omitempty"`
	Revision    uint64        `json:"revision"`
	Gateways    []gatewayView `json:"gateways"`
}

type gatewayView struct {
	Node      string `json:"node"`
	PrivateIP string `json:"privateIP"`
	PublicIP  string `json:"publicIP,omitempty"`
	// MeshAddress is the gateway's address in the mesh address range, which a gateway-mode pair's
	// cable carries.
	MeshAddress string            `json:"meshAddress,omitempty"`
	CablePorts  map[string]uint32 `json:"cablePorts,omitempty"`
	// WireguardPublicKey repeats the public key the gateway publishes for its cable (the
	// attribute a driver's spec names as its PublicKeyAttribute: wireguard's publicKey), under
	// the name this output has always had.
	WireguardPublicKey string                       `json:"wireguardPublicKey,omitempty"`
	CableAttributes    map[string]map[string]string `json:"cableAttributes,omitempty"`
	Drivers            []string                     `json:"drivers,omitempty"`
	Subnets            []string                     `json:"subnets,omitempty"`
	LastHeartbeat      *time.Time                   `json:"lastHeartbeat,omitempty"`
	LeaseExpires       *time.Time                   `json:"leaseExpires,omitempty"`
}

type clusterListView struct {
	Revision uint64        `json:"revision"`
	Clusters []clusterView `json:"clusters"`
}

func newClusterListCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the mesh's clusters and their gateways",
		Args:  exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.ListClusters(ctx, &apiv1.ListClustersRequest{})
				if err != nil {
					return rpcError("list clusters", err)
				}
				return printClusters(cmd.OutOrStdout(), f.output, resp, time.Now())
			})
		},
	}
}

func printClusters(w io.Writer, format string, resp *apiv1.ListClustersResponse, now time.Time) error {
	view := clusterListView{Revision: resp.Revision, Clusters: []clusterView{}}
	for _, c := range resp.Clusters {
		cv := clusterView{
			Name: c.Name, ID: c.Id, UID: c.Uid, Labels: c.Labels,
			PodCIDRs: nonNil(c.PodCidrs), ServiceCIDRs: nonNil(c.ServiceCidrs), GatewayMode: c.GatewayMode,
			JoinedAt: tsPtr(c.JoinedAt.AsTime(), c.JoinedAt != nil), Revision: c.Revision,
			Gateways: []gatewayView{},
		}
		for _, e := range resp.Endpoints {
			if e.Cluster != c.Name {
				continue
			}
			cv.Gateways = append(cv.Gateways, gatewayView{
				Node: e.Node, PrivateIP: e.PrivateIp, PublicIP: e.PublicIp, MeshAddress: e.MeshAddress, CablePorts: e.CablePorts,
				WireguardPublicKey: cablePublicKey(e), CableAttributes: attributes(e), Drivers: e.Drivers, Subnets: e.Subnets,
				LastHeartbeat: tsPtr(e.LastHeartbeat.AsTime(), e.LastHeartbeat != nil),
				LeaseExpires:  tsPtr(e.LeaseExpires.AsTime(), e.LeaseExpires != nil),
			})
		}
		sort.Slice(cv.Gateways, func(i, j int) bool { return cv.Gateways[i].Node < cv.Gateways[j].Node })
		view.Clusters = append(view.Clusters, cv)
	}
	switch format {
	case "json":
		b, err := json.MarshalIndent(view, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(view)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tMODE\tPOD-CIDRS\tSERVICE-CIDRS\tLABELS\tGATEWAYS\tAGE")
	for _, c := range view.Clusters {
		var gws []string
		for _, g := range c.Gateways {
			gw := g.Node + "@" + g.PrivateIP
			if g.MeshAddress != "" {
				gw += "(mesh " + g.MeshAddress + ")"
			}
			gws = append(gws, gw)
		}
		mode := policy.ModeDirect
		if c.GatewayMode {
			mode = policy.ModeGateway
		}
		age := "-"
		if c.JoinedAt != nil {
			age = humanAge(now.Sub(*c.JoinedAt))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.ID, mode, orNone(strings.Join(c.PodCIDRs, ",")),
			orNone(strings.Join(c.ServiceCIDRs, ",")), orNone(formatLabels(c.Labels)), orNone(strings.Join(gws, ",")), age)
	}
	return tw.Flush()
}

func newClusterLabelCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "label NAME k=v [k2=v2] [k3-]...",
		Short: "Set (k=v) or remove (k-) labels of a cluster",
		Long: `Sets (k=v) or removes (k-) labels of a cluster. Connection policies select clusters by
their labels, so the change reaches every agent in its watch stream and each re-resolves its
pairs: see the effect with "cablectl connection-policy list" and "... explain A B".`,
		Example: "  cablectl cluster label east location=on-premise env=production\n  cablectl cluster label east env-",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("%s needs NAME and at least one label change (k=v or k-), got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkClusterNames(args[0]); err != nil {
				return err
			}
			set, remove, err := validation.ParseLabelChanges(args[1:])
			if err != nil {
				return usagef("%v", err)
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				c, err := client.LabelCluster(ctx, &apiv1.LabelClusterRequest{Name: args[0], Set: set, Remove: remove})
				if err != nil {
					return rpcError("label cluster", err)
				}
				return printResult(cmd.OutOrStdout(), f.output, fmt.Sprintf("cluster %s labels: %s", c.Name, orNone(formatLabels(c.Labels))),
					map[string]any{"cluster": c.Name, "labels": c.Labels})
			})
		},
	}
}

func newClusterRemoveCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a cluster and its gateways from the mesh; its certificates and tokens stop working",
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkClusterNames(args[0]); err != nil {
				return err
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.RemoveCluster(ctx, &apiv1.RemoveClusterRequest{Name: args[0]})
				if err != nil {
					return rpcError("remove cluster", err)
				}
				return printResult(cmd.OutOrStdout(), f.output, fmt.Sprintf("cluster %s (id %d) removed", resp.Cluster.Name, resp.Cluster.Id),
					map[string]any{"cluster": resp.Cluster.Name, "id": resp.Cluster.Id, "removed": true})
			})
		},
	}
}

// checkClusterNames refuses names that are not cluster names as bad usage, before anything is
// sent to the broker, in the words the broker would use (api/validation).
func checkClusterNames(names ...string) error {
	for _, n := range names {
		if err := validation.ValidateClusterName(n); err != nil {
			return usagef("%v", err)
		}
	}
	return nil
}

// exactArgs is cobra.ExactArgs with a usage error (exit 2) that names what is expected.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == n {
			return nil
		}
		if n == 0 {
			return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args)
		}
		return usagef("%s needs %s (%d argument), got %d: %q", cmd.CommandPath(), what, n, len(args), args)
	}
}

func formatLabels(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func tsPtr(t time.Time, ok bool) *time.Time {
	if !ok {
		return nil
	}
	t = t.UTC()
	return &t
}

// humanAge formats a duration as kubectl's AGE column does: 45s, 12m, 5h, 3d.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

// attributes flattens an endpoint's per-driver attributes for output.
func attributes(e *apiv1.Endpoint) map[string]map[string]string {
	if len(e.CableAttributes) == 0 {
		return nil
	}
	out := map[string]map[string]string{}
	for d, a := range e.CableAttributes {
		out[d] = a.GetValues()
	}
	return out
}

// cablePublicKey is the first public key (in driver name order) that e publishes for a driver
// whose spec says it has one; "" when it publishes none.
func cablePublicKey(e *apiv1.Endpoint) string {
	for _, spec := range cable.Specs() {
		if attr := spec.Traits.PublicKeyAttribute; attr != "" {
			if k := e.Attributes(spec.Name)[attr]; k != "" {
				return k
			}
		}
	}
	return ""
}
