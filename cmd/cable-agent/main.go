// Command cable-agent is the Cablemesh node agent: `cable-agent --config FILE`.
//
// Exit codes: 0 after a signal (SIGINT/SIGTERM), 1 when the agent cannot run (e.g. its join
// token is refused), 2 for bad usage, a bad config file or a file it names that cannot be used (a
// stateDir that is no directory; on first start a missing or unreadable join token file),
// reported before anything is created.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/cablemesh/cablemesh/agent"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/exports"
	"github.com/cablemesh/cablemesh/agent/handover"
	"github.com/cablemesh/cablemesh/agent/kube"
	"github.com/cablemesh/cablemesh/agent/kubestatus"
	"github.com/cablemesh/cablemesh/agent/mcsimport"
	"github.com/cablemesh/cablemesh/agent/preflight"
	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/agent/uninstall"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/drivers" // registers every cable driver
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "envoy-bootstrap" { // prints a file: no bpffs, no re-exec
		os.Exit(envoyBootstrap(os.Args[2:], os.Stdout, os.Stderr))
	}
	// Before anything else changes the mount namespace: bpffs for the services datapath's pins.
	prepareBPFFS(os.Args[1:], os.Stderr)
	// Then: a driver may re-execute the agent (without kernel WireGuard, the wireguard driver
	// runs it in its own mount namespace for a private UAPI socket dir); the parent then only
	// waits and relays the exit code.
	parentDone, code, err := cable.PrepareProcess()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cable-agent:", err)
		os.Exit(1)
	}
	if parentDone {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cable-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "agent config file (YAML; unknown fields are errors)")
	logLevel := fs.String("log-level", "", "override the config's logLevel: debug | info | warn | error")
	cleanup := fs.Bool("cleanup-on-exit", false, "on exit remove every link, route and socket the agent made (tests, teardown); by default tunnels are left as they are so a restart does not flap them")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "cable-agent: usage: cable-agent --config FILE [--log-level LEVEL] [--cleanup-on-exit]")
		return 2
	}
	// The config is checked whole before anything is created, the drivers' blocks by the drivers.
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}
	if *logLevel != "" {
		cfg.LogLevel = *logLevel
		if err := cfg.Validate(); err != nil {
			fmt.Fprintln(stderr, "cable-agent: --log-level:", err)
			return 2
		}
	}
	if err := preflight.CheckFiles(cfg.Static(), cfg.JoinTokenFile); err != nil {
		fmt.Fprintln(stderr, "cable-agent: agent config "+*configPath+":", err)
		return 2
	}
	// A LevelVar, so that a config reload can change the level (agent/reload.go).
	lv := new(slog.LevelVar)
	lv.Set(cfg.SlogLevel())
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	slog.SetDefault(log)

	opts := agent.Options{Config: cfg, Log: log, ConfigPath: *configPath, LogLevel: lv, LogLevelFlag: *logLevel}
	var statusWriter *kubestatus.Writer // the cluster's ClusterLinks and policies' status; nil: none
	if cfg.Kubernetes.Enabled {
		src, err := kubernetesSource(cfg, log)
		if err != nil {
			fmt.Fprintln(stderr, "cable-agent: kubernetes.enabled:", err)
			return 1
		}
		opts.Kubernetes = src
		if cfg.Gateway {
			// The gateway's endpoint addresses from its Node object (InternalIP, ExternalIP).
			nw, err := nodeWatcher(cfg, log)
			if err != nil {
				fmt.Fprintln(stderr, "cable-agent: kubernetes.enabled:", err)
				return 1
			}
			opts.NodeAddresses = nw
			// The gateways elect the cluster's writer of its MCS ServiceImports.
			api, err := serviceImportsAPI()
			if err != nil {
				fmt.Fprintln(stderr, "cable-agent: kubernetes.enabled: service imports:", err)
				return 1
			}
			opts.ServiceImports = mcsimport.New(mcsimport.Deps{API: api, Identity: cfg.Node, Namespace: podNamespace(),
				Log: log.With("cluster", cfg.Cluster, "node", cfg.Node, "component", "service-imports")})
			// The same writer (the Lease's holder) keeps the ClusterLinks and the policies' status.
			if statusWriter, err = kubeStatusWriter(cfg, opts.ServiceImports, log); err != nil {
				fmt.Fprintln(stderr, "cable-agent: kubernetes.enabled: status:", err)
				return 1
			}
		}
	}
	uninstalled, stopUninstallCheck := uninstallCheck(log)
	defer stopUninstallCheck()
	sigCtx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A successor that takes the node over (a DaemonSet rolled with maxSurge) ends ctx, not a signal.
	ctx, cancel := context.WithCancelCause(sigCtx)
	defer cancel(nil)
	ho := newNodeHandover(cfg.StatusSocket, handover.Identity{Cluster: cfg.Cluster, Node: cfg.Node}, cancel, log.With("component", "handover"))
	opts.TakeOver = ho.takeOver
	opts.StopProcessesOnStop = func() bool { return ho.stopProcesses(ctx) }
	// --cleanup-on-exit, or an uninstall; but handed over, the node is the successor's: never a
	// cleanup then.
	opts.CleanupOnStop = func() bool { return !handedOver(ctx) && (*cleanup || uninstalled()) }
	a, err := agent.New(opts)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}
	if cfg.Kubernetes.Enabled && cfg.PolicyDir == "" {
		// The cluster's ClusterConnectionPolicy objects are its cluster-scoped policies.
		rc, err := rest.InClusterConfig()
		var dc dynamic.Interface
		if err == nil {
			dc, err = dynamic.NewForConfig(rc)
		}
		if err != nil {
			fmt.Fprintln(stderr, "cable-agent: kubernetes.enabled: ClusterConnectionPolicy client:", err)
			return 1
		}
		a.SetClusterPolicySource(&clusterpolicy.KubeSource{Client: dc, Cluster: cfg.Cluster, Log: log.With("component", "clusterpolicies")})
	}
	statusWriter.Follow(a)
	var writers sync.WaitGroup
	writers.Go(func() { statusWriter.Run(ctx) })
	err = a.Run(ctx)
	cancel(nil)
	writers.Wait()
	ho.agentStopped()
	if handedOver(ctx) {
		// The successor runs the node now. Exiting would make the kubelet restart this
		// container beside it; the DaemonSet deletes this pod once the successor is ready.
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("the agent stopped with an error while handing over", "err", err)
		}
		log.Info("node handed over to the next agent; idle until stopped")
		<-sigCtx.Done()
		log.Info("agent stopped (handed over)")
		return 0
	}
	if !*cleanup && uninstalled() {
		// The node's identity and cache go with the install: a later install joins anew.
		if err := uninstall.ClearDir(cfg.StateDir); err != nil {
			log.Error("uninstall: the state dir was not cleared", "err", err)
		} else {
			log.Info("uninstall: state dir cleared", "stateDir", cfg.StateDir)
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("agent stopped", "err", err)
		fmt.Fprintln(stderr, "cable-agent:", err)
		var fe *preflight.FileError
		if errors.As(err, &fe) {
			return 2
		}
		return 1
	}
	log.Info("agent stopped")
	return 0
}

// uninstallCheck follows, in a pod of the agent's DaemonSets, whether the install goes away
// (agent/uninstall) and returns the question asked as the agent stops (once; false outside a
// pod) and what stops the watch.
func uninstallCheck(log *slog.Logger) (uninstalled func() bool, stop func()) {
	det, err := uninstall.FromEnvironment(os.Getenv, log.With("component", "uninstall"))
	if err != nil {
		log.Warn("no uninstall check: the agent keeps its node's state when it stops", "err", err)
	}
	if det == nil {
		return func() bool { return false }, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { det.Run(ctx) })
	return sync.OnceValue(func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), uninstall.CheckTimeout)
			defer cancel()
			v := det.Check(ctx)
			log.Info("stopping: uninstall or restart", "uninstall", v.Uninstall, "reason", v.Reason)
			return v.Uninstall
		}), func() {
			cancel()
			wg.Wait()
		}
}

// kubernetesSource watches the cluster's MCS ServiceExports with the in-cluster credentials (the
// agent's service account).
func kubernetesSource(cfg *config.Config, log *slog.Logger) (exports.Source, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster Kubernetes config: %w", err)
	}
	kc, err := kube.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("the Kubernetes client: %w", err)
	}
	return kube.New(kc, cfg.Cluster, log.With("component", "kubernetes")), nil
}

// serviceImportsAPI writes the cluster's ServiceImports, EndpointSlices and the writer's Lease
// with the in-cluster credentials.
func serviceImportsAPI() (mcsimport.API, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster Kubernetes config: %w", err)
	}
	return mcsimport.NewAPI(rc)
}

// kubeStatusWriter writes the cluster's ClusterLinks and its ClusterConnectionPolicies' status
// with the in-cluster credentials while si, the service-imports writer, holds the cluster's Lease.
func kubeStatusWriter(cfg *config.Config, si *mcsimport.Writer, log *slog.Logger) (*kubestatus.Writer, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster Kubernetes config: %w", err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("the Kubernetes client: %w", err)
	}
	return kubestatus.New(kubestatus.Deps{API: kubestatus.NewAPI(dc), Cluster: cfg.Cluster, Node: cfg.Node,
		Leader: func() bool { return si.Status().Leader },
		Log:    log.With("cluster", cfg.Cluster, "node", cfg.Node, "component", "kube-status")}), nil
}

// podNamespace is the agent's namespace ($POD_NAMESPACE, from the downward API), cablemesh
// when unset.
func podNamespace() string {
	if ns := os.Getenv(uninstall.NamespaceEnv); ns != "" {
		return ns
	}
	return "cablemesh"
}

// nodeWatcher follows this node's Node object (named as the agent's node) with the in-cluster
// credentials.
func nodeWatcher(cfg *config.Config, log *slog.Logger) (*kube.NodeWatcher, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster Kubernetes config: %w", err)
	}
	kc, err := kube.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("the Kubernetes client: %w", err)
	}
	return &kube.NodeWatcher{Client: kc, Node: cfg.Node, Log: log.With("component", "node-addresses")}, nil
}

// prepareBPFFS mounts bpffs at /sys/fs/bpf when the config's bpfPinDir lies below it and it is
// not mounted, before the process may move to a private mount namespace where a bpffs mount
// (and every pin in it) would vanish with the agent. Anything wrong (no config yet, a failed
// mount) is left for run to report: the config's errors with exit code 2, the datapath's in the
// log and the status.
func prepareBPFFS(args []string, stderr io.Writer) {
	if os.Getenv(bpffsPreparedEnv) != "" {
		return // the re-executed child: its parent did it
	}
	fs := flag.NewFlagSet("cable-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "")
	fs.String("log-level", "", "")
	fs.Bool("cleanup-on-exit", false, "")
	if fs.Parse(args) != nil || *configPath == "" {
		return
	}
	cfg, err := config.Load(*configPath)
	if err != nil || preflight.CheckFiles(cfg.Static(), cfg.JoinTokenFile) != nil {
		return
	}
	_ = os.Setenv(bpffsPreparedEnv, "1")
	mounted, warning, err := servicedp.EnsureBPFFS(cfg.BPFPinDir)
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "cable-agent: services datapath:", err)
	case warning != "":
		fmt.Fprintln(stderr, "cable-agent: warning:", warning)
	case mounted:
		fmt.Fprintln(stderr, "cable-agent: mounted bpffs at", config.BPFFSMount)
	}
}

// bpffsPreparedEnv marks a process whose parent already prepared bpffs.
const bpffsPreparedEnv = "CABLEMESH_BPFFS_PREPARED"
