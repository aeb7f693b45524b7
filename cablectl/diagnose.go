package cablectl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/cablemesh/cablemesh/cablectl/diagnose"
)

// errChecksFailed is diagnose's exit 1: the results are printed, stderr says how many failed.
type errChecksFailed struct{ failed, total int }

func (e errChecksFailed) Error() string {
	return fmt.Sprintf("%d of %d checks failed", e.failed, e.total)
}

func newDiagnoseCmd(g *globalFlags) *cobra.Command {
	var socket string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Check this node's part of the mesh and say what is wrong, where, and what to do (from the local agent)",
		Long: "diagnose reads the local cable-agent's status and probes from this node (run it on the node, in the agent's\n" +
			"network namespace). Each check prints ✓ or ✗, its reason and, when it fails, a hint:\n" +
			"  broker        connected to the broker now\n" +
			"  certificate   the node certificate is valid (days until expiry), and renewed when due\n" +
			"  clock-skew    the broker's clock against this node's (from the last heartbeat), within 1s\n" +
			"  connected X   every remote cluster the policies connect this one to is connected\n" +
			"  cable-port X  the remote gateway's cable port answers: WireGuard a handshake within 180s, IPsec an\n" +
			"                established IKE_SA, VXLAN (no handshake) the probes through the tunnel\n" +
			"  mtu X         ping -M do -s MTU-28 through the cable to the remote probe address answers while\n" +
			"                small probes do: no MTU black hole on the underlay\n" +
			"  charon        where ipsec is used: charon runs (not stopped) and answers on its vici socket\n" +
			"  charon D      the same for the charon of driver D (vxlan+ipsec), where D is used\n" +
			"  dns           where DNS is on: the agent's listener answers dns-version.clusterset.local TXT\n" +
			"  ebpf          where services are on: the socket programs are pinned and attached to the cgroup\n" +
			"Exit code 0 when every check passes, 1 when one failed, 2 on bad usage.",
		Example: "  cablectl diagnose\n  cablectl diagnose --socket /run/cablemesh/agent.sock -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(g.output); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			s, err := fetchStatus(ctx, socket)
			if err != nil {
				return err
			}
			results := diagnose.Run(s, runProbes(ctx, s), time.Now())
			if err := printDiagnose(cmd.OutOrStdout(), g.output, results); err != nil {
				return err
			}
			if n := diagnose.Failed(results); n > 0 {
				return errChecksFailed{failed: n, total: len(results)}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultStatusSocket(), "the agent's status socket (its statusSocket setting); env CABLEMESH_AGENT_SOCKET")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long the whole diagnosis may take")
	return cmd
}

// printDiagnose prints one line per check: ✓/✗, the check, its message; a failed one's hint
// below it.
func printDiagnose(w io.Writer, format string, results []diagnose.Result) error {
	if format != "table" {
		return printData(w, format, results)
	}
	for _, r := range results {
		mark := "✓"
		if !r.OK {
			mark = "✗"
		}
		if _, err := fmt.Fprintf(w, "%s %s: %s\n", mark, r.Check, r.Message); err != nil {
			return err
		}
		if !r.OK && r.Hint != "" {
			fmt.Fprintf(w, "    hint: %s\n", r.Hint)
		}
	}
	n := diagnose.Failed(results)
	if n == 0 {
		_, err := fmt.Fprintf(w, "\nall %d checks passed\n", len(results))
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d of %d checks failed\n", n, len(results))
	return err
}
