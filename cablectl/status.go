package cablectl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/policy"
)

// defaultStatusSocket is the agent's default statusSocket (agent/config.DefaultStatusSocket);
// CABLEMESH_AGENT_SOCKET overrides it.
func defaultStatusSocket() string {
	if p := os.Getenv("CABLEMESH_AGENT_SOCKET"); p != "" {
		return p
	}
	return "/run/cablemesh/agent.sock"
}

func newStatusCmd(g *globalFlags) *cobra.Command {
	var socket string
	var timeout, interval time.Duration
	var watch bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show this node's tunnels to every remote cluster and its broker connection (from the local agent)",
		Long: "status asks the local cable-agent over its unix socket what its connections look like on the device:\n" +
			"one row per remote cluster (state, endpoint, RTT, bytes, last handshake), then the broker connection.\n" +
			"RTT is the last health probe's round trip through the tunnel; -o wide adds min/avg/max, p50/p95/p99 and\n" +
			"the probes' health; -o json and -o yaml give everything as data. A connection whose probes failed\n" +
			"healthCheck.failureThreshold times in a row is in state error, whatever its device says; one whose\n" +
			"driver refused to connect it is in state error with the driver's words. Below the broker line: the\n" +
			"agent certificate's expiry and renewal, and the node's problems (a join token file others can read, a\n" +
			"certificate the broker refused).",
		Example: "  cablectl status\n  cablectl status -o wide\n  cablectl status --socket /run/cablemesh/agent.sock -o json\n  cablectl status --watch --interval 2s",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch g.output {
			case "table", "wide", "json", "yaml":
			default:
				return usagef("--output %q: want table, wide, json or yaml", g.output)
			}
			render := func(ctx context.Context) ([]byte, error) {
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				s, err := fetchStatus(ctx, socket)
				if err != nil {
					return nil, err
				}
				var b bytes.Buffer
				err = printStatus(&b, g.output, s, time.Now())
				return b.Bytes(), err
			}
			if watch {
				if interval < 100*time.Millisecond {
					return usagef("--interval %s: want at least 100ms", interval)
				}
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return watchStatus(ctx, cmd.OutOrStdout(), g.output, interval, render)
			}
			out, err := render(cmd.Context())
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultStatusSocket(), "the agent's status socket (its statusSocket setting); env CABLEMESH_AGENT_SOCKET")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the agent")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "keep asking the agent every --interval and redraw when the status changes (until Ctrl-C)")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "with --watch: how often to ask the agent")
	return cmd
}

// fetchStatus GETs the status document over the unix socket; its errors name the socket, as
// every command that asks the agent shows them.
func fetchStatus(ctx context.Context, socket string) (*statusapi.Status, error) {
	s, err := getStatus(ctx, socket)
	if err != nil {
		return nil, fmt.Errorf("cannot reach agent at %s: %w", socket, err)
	}
	return s, nil
}

func getStatus(ctx context.Context, socket string) (*statusapi.Status, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+statusapi.Path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read status: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("agent answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var s statusapi.Status
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("decode status: %w", err)
	}
	return &s, nil
}

// printStatus writes s as a table, JSON or YAML; now is the reference for "ago" columns.
func printStatus(w io.Writer, format string, s *statusapi.Status, now time.Time) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(s)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	wide := format == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "CLUSTER\tID\tDRIVER\tPOLICY\tSTATE\tENDPOINT\tRTT\tMIN/AVG/MAX\tP50/P95/P99\tHEALTH\tPROBES\tRX\tTX\tLAST HANDSHAKE\tMTU")
	} else {
		fmt.Fprintln(tw, "CLUSTER\tID\tDRIVER\tSTATE\tENDPOINT\tRTT\tRX\tTX\tLAST HANDSHAKE")
	}
	for _, c := range s.Connections {
		if wide {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				c.Cluster, c.ClusterID, statusDash(c.Driver), statusDash(c.Policy), statusDash(c.State), statusDash(c.Endpoint), statusRTT(c.RTT),
				statusRTTSpread(c.RTT), statusRTTPercentiles(c.RTT), statusHealth(c.Health), statusProbes(c.Health),
				statusBytes(c.RxBytes), statusBytes(c.TxBytes), statusAgo(c.LastHandshake, now), statusMTU(c.MTU))
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			c.Cluster, c.ClusterID, statusDash(c.Driver), statusDash(c.State), statusDash(c.Endpoint), statusRTT(c.RTT),
			statusBytes(c.RxBytes), statusBytes(c.TxBytes), statusAgo(c.LastHandshake, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range s.Connections {
		if c.Message != "" {
			fmt.Fprintf(w, "  %s: %s\n", c.Cluster, c.Message)
		}
		if h := c.Health; wide && h != nil {
			switch {
			case !h.Probing && h.Reason != "":
				fmt.Fprintf(w, "  %s: not probed: %s\n", c.Cluster, h.Reason)
			case h.Probing:
				line := fmt.Sprintf("  %s: probes %s -> %s every %s, last probe %s", c.Cluster, h.Source, h.Target,
					(time.Duration(h.PeriodMs) * time.Millisecond).String(), statusAgo(h.LastProbe, now))
				if h.LastError != "" {
					line += ", last error: " + h.LastError
				}
				fmt.Fprintln(w, line)
			}
		}
		if tr := c.Traffic; wide && tr != nil {
			fmt.Fprintf(w, "  %s: eBPF counters on the cable: rx %d packets (%s), tx %d packets (%s)\n", c.Cluster,
				tr.RxPackets, statusBytes(tr.RxBytes), tr.TxPackets, statusBytes(tr.TxBytes))
		}
	}
	// Gateway-mode pairs carry only the two gateways' mesh addresses: say which (direct pairs,
	// the default, need no line).
	for _, c := range s.Connections {
		if c.Mode == policy.ModeGateway {
			fmt.Fprintf(w, "  %s: gateway mode: the cable carries only mesh addresses %s <-> %s\n", c.Cluster, statusDash(s.MeshAddress), strings.Join(c.Subnets, ","))
		}
	}
	// Pairs the policies decided not to connect are absent from the table; say so, and why.
	for _, d := range s.Decisions {
		if d.Connect {
			continue
		}
		by := "no policy covers the pair"
		if d.Policy != "" {
			by = "policy " + d.Policy
		}
		fmt.Fprintf(w, "  %s: not connected (no-connect by %s)\n", d.Cluster, by)
	}
	if wide {
		for _, d := range s.Drivers {
			if !d.Running {
				fmt.Fprintf(w, "  driver %s: not running: %s\n", d.Name, d.Error)
			}
		}
	}
	b := s.Broker
	conn := "disconnected"
	if b.Connected {
		conn = "connected"
	}
	line := fmt.Sprintf("Broker: %s %s, revision %d, last contact %s", statusDash(b.Address), conn, b.Revision, statusAgo(b.LastContact, now))
	if b.Cached {
		line += ", running on cached state"
	}
	if b.Error != "" {
		line += ", error: " + b.Error
	}
	if _, err := fmt.Fprintf(w, "\n%s\n", line); err != nil {
		return err
	}
	if b.CertificateNotAfter != nil {
		cert := "Certificate: valid until " + b.CertificateNotAfter.UTC().Format(time.RFC3339) + " (" + statusUntil(*b.CertificateNotAfter, now) + ")"
		switch {
		case b.CertificateRefused:
			cert += ", refused by the broker: join again"
		case b.CertificateRenewAt != nil && !b.CertificateRenewAt.After(now):
			cert += ", renewal due now"
		case b.CertificateRenewAt != nil:
			cert += ", renews " + b.CertificateRenewAt.UTC().Format(time.RFC3339) + " (" + statusUntil(*b.CertificateRenewAt, now) + ")"
		}
		fmt.Fprintln(w, cert)
	}
	if c := s.Config; c != nil {
		fmt.Fprintln(w, statusConfigLine(c, now))
	}
	if line := statusMeshLine(s); line != "" {
		fmt.Fprintln(w, line)
	}
	// Problems of a remote cluster are its row's message above; the node's own are listed here.
	first := true
	for _, p := range s.Problems {
		if p.Cluster != "" {
			continue
		}
		if first {
			fmt.Fprintln(w, "Problems:")
			first = false
		}
		fmt.Fprintf(w, "  %s\n", p.Message)
	}
	if err := printWorkerSection(w, s.Worker, now); err != nil {
		return err
	}
	return printServicesSection(w, s.Services, wide)
}

// statusUntil says how far t is from now: "in 12s", "in 3h", "in 243d", or "expired 2d ago".
func statusUntil(t, now time.Time) string {
	if t.Before(now) {
		return "expired " + statusAgo(&t, now)
	}
	d := t.Sub(now)
	switch {
	case d < 2*time.Minute:
		return "in " + strconv.Itoa(int(d/time.Second)) + "s"
	case d < 2*time.Hour:
		return "in " + strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return "in " + strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return "in " + strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

func statusDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// statusRTT is the last probe RTT, or "-" without probe data.
func statusRTT(r *statusapi.RTT) string {
	if r == nil {
		return "-"
	}
	return statusMs(r.LastMs)
}

// statusMs formats milliseconds with one decimal ("0.4ms", "12.3ms"); below a tenth of a
// millisecond (namespaces on one host) in whole microseconds ("45µs"), which "0.0ms" would hide.
func statusMs(v float64) string {
	if v > 0 && v < 0.1 {
		return strconv.FormatFloat(v*1000, 'f', 0, 64) + "µs"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + "ms"
}

// statusRTTSpread is "min/avg/max" of the probe window.
func statusRTTSpread(r *statusapi.RTT) string {
	if r == nil {
		return "-"
	}
	return statusMs(r.MinMs) + "/" + statusMs(r.AvgMs) + "/" + statusMs(r.MaxMs)
}

// statusRTTPercentiles is "p50/p95/p99" of the probe window.
func statusRTTPercentiles(r *statusapi.RTT) string {
	if r == nil {
		return "-"
	}
	return statusMs(r.P50Ms) + "/" + statusMs(r.P95Ms) + "/" + statusMs(r.P99Ms)
}

// statusHealth is ok, "1/3 failed" (failing, not yet down), down, or "not probed".
func statusHealth(h *statusapi.Health) string {
	switch {
	case h == nil:
		return "-"
	case !h.Probing:
		return "not probed"
	case !h.Healthy:
		return "down"
	case h.ConsecutiveFailures > 0:
		return strconv.Itoa(h.ConsecutiveFailures) + "/" + strconv.Itoa(h.FailureThreshold) + " failed"
	case h.ProbesSent == 0:
		return "pending"
	}
	return "ok"
}

// statusProbes is "sent/failed".
func statusProbes(h *statusapi.Health) string {
	if h == nil || !h.Probing {
		return "-"
	}
	return strconv.FormatUint(h.ProbesSent, 10) + "/" + strconv.FormatUint(h.ProbesFailed, 10)
}

func statusMTU(mtu int) string {
	if mtu == 0 {
		return "-"
	}
	return strconv.Itoa(mtu)
}

// statusBytes formats a byte count in IEC units: 512 B, 1.2 KiB, 3.4 MiB.
func statusBytes(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v := float64(n)
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		v /= 1024
		if v < 1024 || unit == "PiB" {
			return strconv.FormatFloat(v, 'f', 1, 64) + " " + unit
		}
	}
	return "" // unreachable
}

// statusAgo formats how long ago t was ("12s ago", "5m ago"), or "never".
func statusAgo(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	d := now.Sub(*t)
	switch {
	case d < 0:
		return "0s ago"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s ago"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d ago"
}

// statusConfigLine is the agent config in force: its revision, the start of its hash, and the
// fields of a refused newer file (the messages are under Problems).
func statusConfigLine(c *statusapi.ConfigStatus, now time.Time) string {
	loaded := c.LoadedAt
	line := fmt.Sprintf("Config: revision %d, %s, loaded %s", c.Revision, statusDash(shortHash(c.Hash)), statusAgo(&loaded, now))
	if len(c.Refused) > 0 {
		var fields []string
		for _, r := range c.Refused {
			f := r.Field
			if f == "" {
				f = "(file)"
			}
			fields = append(fields, f)
		}
		line += ", newer file refused: " + strings.Join(fields, ", ")
	}
	return line
}

// statusMeshLine is the gateway-mode line: the node's mesh address and what its ingress data
// plane programs; "" on a node without a mesh address or data plane.
func statusMeshLine(s *statusapi.Status) string {
	var dp *statusapi.IngressDataplane
	mode := ""
	if s.Ingress != nil {
		dp, mode = s.Ingress.Dataplane, s.Ingress.Mode
	}
	if s.MeshAddress == "" && dp == nil {
		return ""
	}
	line := "Mesh address: " + statusDash(s.MeshAddress)
	if dp == nil {
		return line
	}
	if dp.MeshLink == "" && dp.Error == "" && dp.Ports == 0 && dp.RemoteMeshAddresses == 0 {
		// The broker gives every gateway a mesh address; only gateway mode uses it.
		return line + " (not in use: no gateway-mode pair)"
	}
	line += fmt.Sprintf(", ingress %s (%s): ", statusDash(mode), dp.Kind)
	if !dp.Programmed {
		line += "not programmed"
	} else {
		line += fmt.Sprintf("%d ports (%d without backends), %d backends, SNAT for %d remote gateways", dp.Ports, dp.PortsWithoutBackends, dp.Backends, dp.RemoteMeshAddresses)
	}
	if dp.Error != "" {
		line += ", error: " + dp.Error
	}
	return line
}
