package cablectl

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// printWorkerSection prints a non-gateway node's gateways (its probes of them) and how it routes
// each remote cluster; nothing for a gateway (wk nil).
func printWorkerSection(w io.Writer, wk *statusapi.Worker, now time.Time) error {
	if wk == nil {
		return nil
	}
	if _, err := fmt.Fprintf(w, "\nLocal gateways (probed every %dms, unhealthy after %d failures):\n", wk.ProbePeriodMs, wk.FailureThreshold); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  GATEWAY\tADDRESS\tHEALTH\tRTT\tPROBES\tLAST ANSWER")
	for _, g := range wk.Gateways {
		health := "healthy"
		switch {
		case !g.Probing:
			health = "not probed yet"
		case !g.Healthy:
			health = fmt.Sprintf("down (%d failures: %s)", g.ConsecutiveFailures, g.LastError)
		}
		rtt := "-"
		if g.RTTMs > 0 {
			rtt = statusMs(g.RTTMs)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d/%d failed\t%s\n", g.Node, g.Address, health, rtt, g.ProbesFailed, g.ProbesSent, statusAgo(g.LastSuccess, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "Routes:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  CLUSTER\tVIA\tCARRIERS\tSUBNETS\tNOTE")
	for _, r := range wk.Routes {
		fmt.Fprintf(tw, "  %s\t%s (%s)\t%s\t%s\t%s\n", r.Cluster, r.Via, statusDash(r.Address), statusDash(strings.Join(r.Carriers, ",")),
			statusDash(strings.Join(r.Subnets, ",")), statusDash(r.Reason))
	}
	return tw.Flush()
}
