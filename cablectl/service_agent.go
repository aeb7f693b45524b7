package cablectl

// The agent-side service commands: `service export | unexport` talk to the local cable-agent over
// its unix socket (its runtime exports, kept in its stateDir), not to the broker; and the
// services section of `cablectl status`. Bad flags are refused, naming the flag and the value,
// before the agent is contacted (exit 2); a refusal by the agent exits 1.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/api/validation"
)

// addServiceAgentCommands adds export and unexport to the service command.
func addServiceAgentCommands(svc *cobra.Command, g *globalFlags) {
	svc.AddCommand(newServiceExportCmd(g), newServiceUnexportCmd(g))
}

// agentClient is an HTTP client over the agent's unix socket.
func agentClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

// agentCall sends method path (body as JSON, when not nil) to the agent and decodes a 2xx
// answer into out (when not nil); an error answer becomes an error with the agent's message.
func agentCall(ctx context.Context, socket, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := agentClient(socket).Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach agent at %s: %w", socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read the agent's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e statusapi.Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return fmt.Errorf("agent answered %s: %s", resp.Status, strings.TrimSpace(string(data)))
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode the agent's answer: %w", err)
		}
	}
	return nil
}

// parsePortFlag reads one --port: [NAME:]PORT[/PROTO], protocol TCP by default.
func parsePortFlag(s string) (statusapi.ServicePort, error) {
	var p statusapi.ServicePort
	rest := s
	if name, num, ok := strings.Cut(s, ":"); ok {
		p.Name, rest = name, num
		if name == "" {
			return p, fmt.Errorf("--port %q: empty port name before ':' (want NAME:PORT/PROTO)", s)
		}
	}
	num, proto, hasProto := strings.Cut(rest, "/")
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > 65535 {
		return p, fmt.Errorf("--port %q: %q is not a port number (1..65535); want NAME:PORT/PROTO", s, num)
	}
	p.Port = uint32(n)
	p.Protocol = "TCP"
	if hasProto {
		switch strings.ToUpper(proto) {
		case "TCP", "UDP", "SCTP":
			p.Protocol = strings.ToUpper(proto)
		default:
			return p, fmt.Errorf("--port %q: protocol %q is not TCP, UDP or SCTP", s, proto)
		}
	}
	return p, nil
}

// parseEndpointFlag reads one --endpoint: IP[,hostname=H][,ready=false].
func parseEndpointFlag(s string) (statusapi.ServiceEndpoint, error) {
	parts := strings.Split(s, ",")
	e := statusapi.ServiceEndpoint{IP: parts[0], Ready: true}
	a, err := netip.ParseAddr(parts[0])
	if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
		return e, fmt.Errorf("--endpoint %q: %q is not a unicast IP address; want IP[,hostname=H][,ready=false]", s, parts[0])
	}
	seen := map[string]bool{}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || seen[k] {
			return e, fmt.Errorf("--endpoint %q: %q is not hostname=H or ready=true|false (each at most once)", s, kv)
		}
		seen[k] = true
		switch k {
		case "hostname":
			if err := validation.ValidateDNSLabel("hostname", v); err != nil {
				return e, fmt.Errorf("--endpoint %q: %w", s, err)
			}
			e.Hostname = v
		case "ready":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return e, fmt.Errorf("--endpoint %q: ready=%q is not true or false", s, v)
			}
			e.Ready = b
		default:
			return e, fmt.Errorf("--endpoint %q: unknown key %q (want hostname or ready)", s, k)
		}
	}
	return e, nil
}

// buildExport turns the export command's flags into an export and validates it with the agent's
// rules (the MCS export rules), so a bad export never reaches the agent.
func buildExport(name, namespace, typ, labels, affinity string, ports, endpoints []string) (statusapi.Export, error) {
	x := statusapi.Export{Name: name, Namespace: namespace, Type: typ, Affinity: affinity,
		Ports: []statusapi.ServicePort{}, Endpoints: []statusapi.ServiceEndpoint{}}
	if err := validation.ValidateDNSLabel("service name", name); err != nil {
		return x, err
	}
	if err := validation.ValidateDNSLabel("namespace", namespace); err != nil {
		return x, fmt.Errorf("--namespace: %w", err)
	}
	switch typ {
	case "", "ClusterSetIP", "Headless":
	default:
		return x, fmt.Errorf("--type %q: want ClusterSetIP or Headless", typ)
	}
	switch affinity {
	case "", "local", "none":
	default:
		return x, fmt.Errorf("--affinity %q: want local or none", affinity)
	}
	if labels != "" {
		l, err := validation.ParseLabels(labels)
		if err != nil {
			return x, fmt.Errorf("--labels %q: %w", labels, err)
		}
		x.Labels = l
	}
	for _, s := range ports {
		p, err := parsePortFlag(s)
		if err != nil {
			return x, err
		}
		x.Ports = append(x.Ports, p)
	}
	for _, s := range endpoints {
		e, err := parseEndpointFlag(s)
		if err != nil {
			return x, err
		}
		x.Endpoints = append(x.Endpoints, e)
	}
	ce := config.Export{Name: x.Name, Namespace: x.Namespace, Type: x.Type, Labels: x.Labels, Affinity: x.Affinity}
	for _, p := range x.Ports {
		ce.Ports = append(ce.Ports, config.ExportPort{Name: p.Name, Port: int(p.Port), Protocol: p.Protocol})
	}
	for _, e := range x.Endpoints {
		r := e.Ready
		ce.Endpoints = append(ce.Endpoints, config.ExportEndpoint{IP: e.IP, Hostname: e.Hostname, Ready: &r})
	}
	if _, err := config.NormalizeExport("export", ce); err != nil {
		return x, fmt.Errorf("%w (--port is export.ports[i], --endpoint export.endpoints[i], in flag order)", err)
	}
	return x, nil
}

func newServiceExportCmd(g *globalFlags) *cobra.Command {
	var (
		namespace, typ, labels, affinity, socket string
		ports, endpoints                         []string
		timeout                                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "export NAME --namespace NS --port NAME:PORT/PROTO --endpoint IP[,hostname=H][,ready=false] [--type Headless] --socket AGENT_SOCKET",
		Short: "Export a service from this node, through the local agent (kept across agent restarts)",
		Long: `export asks the local cable-agent (over its status socket) to export a service: the agent keeps it
in its stateDir (exports.json), so it survives a restart, and sends the node's whole set of exports
to the broker. Exporting the same namespace/name again replaces it. An export the agent config file
defines cannot be changed here. --port and --endpoint are repeatable.`,
		Example: "  cablectl service export web -n shop --port http:80/TCP --endpoint 10.1.0.10 --endpoint 10.1.0.11,ready=false --socket /run/cablemesh/agent.sock\n" +
			"  cablectl service export db -n shop --type Headless --port pg:5432/TCP --endpoint 10.1.0.20,hostname=db-0",
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(g.output); err != nil {
				return err
			}
			x, err := buildExport(args[0], namespace, typ, labels, affinity, ports, endpoints)
			if err != nil {
				return usagef("%v", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var res statusapi.ExportResult
			if err := agentCall(ctx, socket, http.MethodPut, statusapi.ExportsPath+x.Namespace+"/"+x.Name, x, &res); err != nil {
				return fmt.Errorf("export %s/%s: %w", x.Namespace, x.Name, err)
			}
			return printExportResult(cmd.OutOrStdout(), g.output, res)
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the service")
	cmd.Flags().StringArrayVar(&ports, "port", nil, "a port, NAME:PORT/PROTO (PROTO TCP, UDP or SCTP; default TCP); repeatable")
	cmd.Flags().StringArrayVar(&endpoints, "endpoint", nil, "a backend, IP[,hostname=H][,ready=false]; repeatable")
	cmd.Flags().StringVar(&typ, "type", "", "ClusterSetIP (default) or Headless")
	cmd.Flags().StringVar(&labels, "labels", "", "labels the importing clusters' selectors match, k=v,k2=v2 (cablemesh.io/exported=true is added unless set)")
	cmd.Flags().StringVar(&affinity, "affinity", "", "local (default: callers in this cluster use its backends while one is ready) or none")
	cmd.Flags().StringVar(&socket, "socket", defaultStatusSocket(), "the agent's status socket (its statusSocket setting); env CABLEMESH_AGENT_SOCKET")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the agent")
	return cmd
}

func newServiceUnexportCmd(g *globalFlags) *cobra.Command {
	var (
		namespace, socket string
		timeout           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "unexport NAME --namespace NS --socket AGENT_SOCKET",
		Short: "Withdraw a service this node exported with `service export`, through the local agent",
		Long: `unexport asks the local cable-agent to withdraw a runtime export (one made with service export).
An export defined in the agent config file, or by a Kubernetes ServiceExport, is refused, saying
where it is defined.`,
		Example: "  cablectl service unexport web -n shop --socket /run/cablemesh/agent.sock",
		Args:    exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validation.ValidateDNSLabel("service name", args[0]); err != nil {
				return usagef("%v", err)
			}
			if err := validation.ValidateDNSLabel("namespace", namespace); err != nil {
				return usagef("--namespace: %v", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if err := agentCall(ctx, socket, http.MethodDelete, statusapi.ExportsPath+namespace+"/"+args[0], nil, nil); err != nil {
				return fmt.Errorf("unexport %s/%s: %w", namespace, args[0], err)
			}
			return printResult(cmd.OutOrStdout(), g.output, fmt.Sprintf("service %s/%s unexported", namespace, args[0]),
				map[string]any{"namespace": namespace, "name": args[0], "unexported": true})
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the service")
	cmd.Flags().StringVar(&socket, "socket", defaultStatusSocket(), "the agent's status socket (its statusSocket setting); env CABLEMESH_AGENT_SOCKET")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the agent")
	return cmd
}

func printExportResult(w io.Writer, format string, res statusapi.ExportResult) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(res)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	x := res.Export
	ready := 0
	for _, e := range x.Endpoints {
		if e.Ready {
			ready++
		}
	}
	_, err := fmt.Fprintf(w, "service %s/%s exported (%s, ports %s, %s, %d ready)\n",
		x.Namespace, x.Name, x.Type, exportPorts(x.Ports), count(len(x.Endpoints), "endpoint"), ready)
	return err
}

func exportPorts(ps []statusapi.ServicePort) string {
	if len(ps) == 0 {
		return "-"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		s := strconv.FormatUint(uint64(p.Port), 10) + "/" + p.Protocol
		if p.Name != "" {
			s = p.Name + ":" + s
		}
		out[i] = s
	}
	return strings.Join(out, ",")
}

// fetchServices reads the agent's services section (GET /v1/services).
func fetchServices(ctx context.Context, socket string) (*statusapi.Services, error) {
	var s statusapi.Services
	if err := agentCall(ctx, socket, http.MethodGet, statusapi.ServicesPath, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// agentBackends is what the local agent's eBPF maps hold of namespace/name, for `service
// describe --socket`: every backend programmed for any of its VIP ports, by cluster ID and IP.
func agentBackends(ctx context.Context, socket, namespace, name string) (*localBackends, error) {
	s, err := fetchServices(ctx, socket)
	if err != nil {
		return nil, err
	}
	lb := &localBackends{Source: "agent at " + socket, Held: map[backendKey]bool{}}
	for _, imp := range s.Imports {
		if imp.Namespace != namespace || imp.Name != name {
			continue
		}
		lb.Refused = imp.LoadBalancerRefused
		for _, c := range imp.Clusters {
			for _, b := range c.Backends {
				hostPort, _, _ := strings.Cut(b, "/")
				if ap, err := netip.ParseAddrPort(hostPort); err == nil {
					lb.Held[backendKey{ClusterID: c.ClusterID, IP: ap.Addr()}] = true
				}
			}
		}
	}
	return lb, nil
}

// printServicesSection writes the services part of `cablectl status`.
func printServicesSection(w io.Writer, s *statusapi.Services, wide bool) error {
	if s == nil {
		return nil
	}
	lbState := "not running"
	if s.LoadBalancer.Running {
		lbState = fmt.Sprintf("cgroup %s, %s in the maps, %s destroyed", s.LoadBalancer.CgroupPath, count(s.LoadBalancer.Services, "service"), count(int(s.LoadBalancer.SocketsDestroyed), "socket"))
	}
	if s.LoadBalancer.Refused > 0 {
		lbState += fmt.Sprintf(", %s refused: the maps (%d service, %d backend entries) are full", count(s.LoadBalancer.Refused, "import"),
			s.LoadBalancer.ServiceMapEntries, s.LoadBalancer.BackendMapEntries)
	}
	if s.LoadBalancer.Error != "" {
		lbState += " (error: " + s.LoadBalancer.Error + ")"
	}
	dnsState := "off"
	if s.DNS.Enabled {
		dnsState = s.DNS.Listen
	}
	sel := s.ImportSelector
	if sel == "" {
		sel = `"" (imports nothing)`
	}
	fmt.Fprintf(w, "\nServices: import selector %s; DNS %s; load balancer %s\n", sel, dnsState, lbState)
	if !s.ImportsKnown {
		fmt.Fprintln(w, "  no imports received from the broker yet (DNS answers SERVFAIL)")
	} else if len(s.Imports) == 0 {
		fmt.Fprintln(w, "  no service imported")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SERVICE\tTYPE\tVIP\tPORTS\tCLUSTER\tENDPOINTS\tREADY\tUSABLE\tIN MAPS")
		for _, imp := range s.Imports {
			vip := "-"
			if len(imp.VIPs) > 0 {
				vip = strings.Join(imp.VIPs, ",")
			}
			head := []string{imp.Namespace + "/" + imp.Name, imp.Type, vip, exportPorts(imp.Ports)}
			if len(imp.Clusters) == 0 {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\n", strings.Join(head, "\t"))
			}
			for i, c := range imp.Clusters {
				if i > 0 {
					head = []string{"", "", "", ""}
				}
				name := c.Cluster
				if c.Local {
					name += " (local)"
				}
				maps := "-"
				if imp.Type != "Headless" {
					maps = strconv.Itoa(len(c.Backends))
					if wide && len(c.Backends) > 0 {
						maps = strings.Join(c.Backends, ",")
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", strings.Join(head, "\t"), name, len(c.Endpoints), c.ReadyEndpoints, yesNoStatus(c.Usable), maps)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, imp := range s.Imports {
			for _, c := range imp.Clusters {
				// A gateway-mode cluster's reason says where it is reached (its gateway's ingress).
				if !c.Usable || c.GatewayMode {
					fmt.Fprintf(w, "  %s/%s %s: %s\n", imp.Namespace, imp.Name, c.Cluster, c.Reason)
				}
			}
			for _, c := range imp.Conflicts {
				fmt.Fprintf(w, "  %s/%s conflict, %s's export left out (%s): %s\n", imp.Namespace, imp.Name, c.Cluster, c.Field, c.Message)
			}
			if imp.LoadBalancerRefused != "" {
				fmt.Fprintf(w, "  %s/%s NOT IN THE LOAD BALANCER: %s\n", imp.Namespace, imp.Name, imp.LoadBalancerRefused)
			}
		}
	}
	for _, p := range s.Problems {
		fmt.Fprintf(w, "  left out: %s\n", p)
	}
	if len(s.Exports) > 0 {
		state := "not sent to the broker yet"
		switch {
		case s.Sync.InSync:
			state = fmt.Sprintf("at the broker (revision %d)", s.Sync.Revision)
		case s.Sync.Error != "":
			state = "NOT at the broker: " + s.Sync.Error
		}
		fmt.Fprintf(w, "Exports of this node: %s\n", state)
		for _, e := range s.Exports {
			line := fmt.Sprintf("  %s/%s (%s, %s) ports %s, %s", e.Namespace, e.Name, e.Source, e.Type, exportPorts(e.Ports), count(len(e.Endpoints), "endpoint"))
			if e.Shadowed != "" {
				line += ", shadowed by the " + e.Shadowed + " export"
			}
			fmt.Fprintln(w, line)
		}
		for _, c := range s.Sync.Conflicts {
			fmt.Fprintf(w, "  conflict (%s): %s\n", c.Field, c.Message)
		}
	}
	return nil
}

func yesNoStatus(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// count is "1 endpoint", "2 endpoints".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
