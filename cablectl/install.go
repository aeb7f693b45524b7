package cablectl

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/spf13/cobra"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/deploy"
)

// newInstallCmd is `cablectl install kubernetes`: as `linkerd install` does, the command
// prints what kubectl applies; the manifests are deploy/'s, embedded (package deploy).
func newInstallCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Print the manifests that install Cablemesh in a cluster (kubectl apply -f -)",
	}
	f := newAdminFlags(g, cmd)
	cmd.AddCommand(newInstallKubernetesCmd(f))
	return cmd
}

func newUninstallCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Print what kubectl delete -f - needs to remove Cablemesh from a cluster",
	}
	cmd.AddCommand(newUninstallKubernetesCmd())
	return cmd
}

type installFlags struct {
	cluster, gatewayNodes, labels, agentBroker, image, envoyImage string
	podCIDRs, svcCIDRs                                            []string
	validFor                                                      time.Duration
	maxNodes                                                      uint32
	ingressEnvoy                                                  bool
	gatewayMode                                                   bool
}

func newInstallKubernetesCmd(f *adminFlags) *cobra.Command {
	var fl installFlags
	cmd := &cobra.Command{
		Use:   "kubernetes --cluster NAME --pod-cidr CIDR [--service-cidr CIDR] [--gateway-nodes SELECTOR] [--gateway-mode]",
		Short: "Create the cluster and its join token at the broker and print the cluster's manifests",
		Long: `Creates the cluster at the broker if it is new (as cluster join-token does) and a join token
for its nodes, then prints on stdout, as multi-document YAML, everything the cluster needs: the
CRDs (ClusterConnectionPolicy, MCS ServiceExport and ServiceImport), the cablemesh namespace, the
agent's service account and least-privilege RBAC, its config, the join token as a Secret (mounted
as a file, never an environment variable) and the agent's DaemonSets: cable-agent on the gateway
nodes (--gateway-nodes) and cable-agent-worker on every other Linux node.

  cablectl install kubernetes --cluster east --pod-cidr 10.1.0.0/16 | kubectl apply -f -

The agents dial the broker at --agent-broker (default: the admin config's address, which must
then be one they can reach). The token joins up to --max-nodes nodes (gateways and workers: every
node runs an agent) and expires after --valid-for: a node that joined keeps its certificate, so
re-run install only to add nodes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, pods, svcs, lbls, err := fl.values()
			if err != nil {
				return err
			}
			if v.Broker == "" {
				cfg, err := adminconfig.Load(f.config)
				if err != nil {
					return err
				}
				v.Broker = cfg.Broker
				if f.broker != "" {
					v.Broker = f.broker
				}
				warnLoopbackBroker(cmd, v.Broker)
			}
			// Everything is checked before the broker is asked for a token.
			if err := v.Validate(); err != nil {
				return usagef("%v", err)
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				// The same call as `cablectl cluster join-token`: it creates the cluster when new.
				resp, err := client.CreateJoinToken(ctx, &apiv1.CreateJoinTokenRequest{
					Cluster:         fl.cluster,
					PodCidrs:        validation.Strings(pods),
					ServiceCidrs:    validation.Strings(svcs),
					Labels:          lbls,
					ValidForSeconds: int64(fl.validFor / time.Second),
					MaxNodes:        fl.maxNodes,
					GatewayMode:     fl.gatewayMode,
				})
				if err != nil {
					return rpcError("create join token", err)
				}
				v.JoinToken = resp.Token
				out, err := deploy.AgentManifests(v)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if _, err := fmt.Fprintf(w, "# Cablemesh member cluster %s: kubectl apply -f -\n", fl.cluster); err != nil {
					return err
				}
				_, err = w.Write(out)
				return err
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&fl.cluster, "cluster", "", "name of the cluster (required)")
	fs.StringSliceVar(&fl.podCIDRs, "pod-cidr", nil, "pod CIDR of the cluster (repeatable, or a comma list; required)")
	fs.StringSliceVar(&fl.svcCIDRs, "service-cidr", nil, "service CIDR of the cluster (repeatable, or a comma list)")
	fs.StringVar(&fl.gatewayNodes, "gateway-nodes", deploy.DefaultGateways, "label selector of the gateway nodes; every other Linux node runs the agent as a worker (k=v,k2 in (a,b),!k3)")
	fs.StringVar(&fl.labels, "labels", "", "labels of a new cluster, k=v,k2=v2")
	fs.BoolVar(&fl.gatewayMode, "gateway-mode", false, "create the cluster in gateway mode, as cluster join-token --gateway-mode (re-runs for more nodes must give it too)")
	fs.DurationVar(&fl.validFor, "valid-for", 24*time.Hour, "how long the join token is valid")
	fs.Uint32Var(&fl.maxNodes, "max-nodes", 3, "how many distinct nodes (gateways and workers) the token may join")
	fs.StringVar(&fl.agentBroker, "agent-broker", "", "broker address the agents dial, host:port[,host:port] (default: the admin config's, or --broker)")
	fs.StringVar(&fl.image, "image", deploy.DefaultAgentTag, "the agent's container image")
	fs.BoolVar(&fl.ingressEnvoy, "ingress-envoy", false, "run an Envoy ingress beside the agent (for ingress.mode envoy)")
	fs.StringVar(&fl.envoyImage, "envoy-image", deploy.DefaultEnvoyTag, "Envoy's container image, with --ingress-envoy")
	return cmd
}

// values checks the flags (exit 2 on a bad one) and builds the render values.
func (fl *installFlags) values() (v deploy.AgentValues, pods, svcs []netip.Prefix, lbls map[string]string, err error) {
	if fl.cluster == "" {
		return v, nil, nil, nil, usagef("--cluster is required")
	}
	if err := checkClusterNames(fl.cluster); err != nil {
		return v, nil, nil, nil, err
	}
	if len(fl.podCIDRs) == 0 {
		return v, nil, nil, nil, usagef("--pod-cidr is required")
	}
	if pods, err = validation.ParseCIDRs("pod CIDR", fl.podCIDRs); err != nil {
		return v, nil, nil, nil, usagef("--pod-cidr: %v", err)
	}
	if svcs, err = validation.ParseCIDRs("service CIDR", fl.svcCIDRs); err != nil {
		return v, nil, nil, nil, usagef("--service-cidr: %v", err)
	}
	for _, p := range append(slices.Clone(pods), svcs...) {
		if err := validation.CheckClusterCIDR("CIDR", p); err != nil {
			return v, nil, nil, nil, usagef("%v", err)
		}
	}
	if lbls, err = validation.ParseLabels(fl.labels); err != nil {
		return v, nil, nil, nil, usagef("--labels: %v", err)
	}
	if fl.validFor <= 0 || fl.validFor%time.Second != 0 {
		return v, nil, nil, nil, usagef("--valid-for %s: must be a positive number of whole seconds", fl.validFor)
	}
	if fl.maxNodes < 1 {
		return v, nil, nil, nil, usagef("--max-nodes %d: a token joins at least one node", fl.maxNodes)
	}
	v = deploy.AgentValues{
		Cluster:      fl.cluster,
		Broker:       fl.agentBroker,
		PodCIDRs:     validation.Strings(pods),
		ServiceCIDRs: validation.Strings(svcs),
		GatewayNodes: fl.gatewayNodes,
		Image:        fl.image,
		IngressEnvoy: fl.ingressEnvoy,
		EnvoyImage:   fl.envoyImage,
	}
	return v, pods, svcs, lbls, nil
}

// warnLoopbackBroker says so when the agents would dial a loopback broker address (admin.yaml
// names 127.0.0.1 when the broker listens on every address): no pod reaches that.
func warnLoopbackBroker(cmd *cobra.Command, broker string) {
	host, _, err := net.SplitHostPort(broker)
	if err != nil {
		return
	}
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || host == "localhost" {
		fmt.Fprintf(cmd.ErrOrStderr(), "Warning: the agents will dial the broker at %s, a loopback address; give --agent-broker an address the cluster's nodes reach\n", broker)
	}
}

func newUninstallKubernetesCmd() *cobra.Command {
	var (
		cluster     string
		includeCRDs bool
	)
	cmd := &cobra.Command{
		Use:   "kubernetes --cluster NAME [--include-crds]",
		Short: "Print the cluster's Cablemesh objects for kubectl delete -f -",
		Long: `Prints the objects install created (the join token Secret included, without its token), for

  cablectl uninstall kubernetes --cluster east | kubectl delete -f -

The CRDs are left out unless --include-crds: deleting a CRD deletes every object of its kind in
the cluster, other MCS users' ServiceExports included. The cluster stays at the broker: remove it
there with cablectl cluster remove. The objects are printed in the reverse order of install, the
DaemonSets first: each agent sees its DaemonSet (or namespace) deleted and, as it stops, removes
what it made on its node (links, routes, pins in /sys/fs/bpf/cablemesh, the contents of
/var/lib/cablemesh), where a restart leaves all of it in place.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cluster == "" {
				return usagef("--cluster is required")
			}
			if err := checkClusterNames(cluster); err != nil {
				return err
			}
			// Any valid values do: kubectl delete reads kinds and names only.
			objs, err := deploy.AgentObjects(deploy.AgentValues{Cluster: cluster, Broker: "broker.invalid:7443", PodCIDRs: []string{"192.0.2.0/24"}, WithoutCRDs: !includeCRDs})
			if err != nil {
				return err
			}
			// kubectl delete goes in file order: the DaemonSets first, while the agents' service
			// account and roles still exist, the namespace and the CRDs last.
			slices.Reverse(objs)
			secret := deploy.Object{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": deploy.SecretName, "namespace": deploy.Namespace}}
			afterDaemonSets := slices.IndexFunc(objs, func(o deploy.Object) bool { return o["kind"] != "DaemonSet" })
			objs = slices.Insert(objs, max(afterDaemonSets, 0), secret)
			out, err := deploy.Encode(objs)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if _, err := fmt.Fprintf(w, "# Cablemesh member cluster %s: kubectl delete -f -\n", cluster); err != nil {
				return err
			}
			_, err = w.Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "name of the cluster (required)")
	cmd.Flags().BoolVar(&includeCRDs, "include-crds", false, "also delete the CRDs (and with them every ClusterConnectionPolicy, ServiceExport and ServiceImport)")
	return cmd
}
