//go:build bench

package bench

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/internal/benchresults"
)

// startReport is the Markdown of a first-packets bench (pairstart, wgstart): a title, a line on
// the machine, the metric and the command, one table row per build or phase, the series of each
// row, and the notes. Both benches write the same layout, so a reader can set them side by side.
type startReport struct {
	Title   string
	Machine string
	Metric  string
	Command string
	// Table is the table's header row and its separator row; Rows are its rows, each one line.
	Table string
	Rows  []string
	// Series are the per-sample lists, in the order they are printed.
	Series []startSeries
	Notes  []string
}

// startSeries is one list of per-sample values: "<Label>, <What>: v1, v2, ...".
type startSeries struct {
	Label, What string
	Values      []string
}

// formatEach is value of each sample, formatted.
func formatEach[S any](samples []S, format string, value func(S) float64) []string {
	out := make([]string, 0, len(samples))
	for _, s := range samples {
		out = append(out, fmt.Sprintf(format, value(s)))
	}
	return out
}

// markdown renders the report.
func (r startReport) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.Title)
	fmt.Fprintf(&b, "%s\n\n", r.Machine)
	fmt.Fprintf(&b, "Metric: %s.\n\nCommand: `%s`\n\n", r.Metric, r.Command)
	fmt.Fprintf(&b, "%s\n", r.Table)
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "%s\n", row)
	}
	for _, s := range r.Series {
		fmt.Fprintf(&b, "\n%s, %s: %s\n", s.Label, s.What, strings.Join(s.Values, ", "))
	}
	fmt.Fprintf(&b, "\nNotes:\n\n")
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// writeStartReport saves res (JSON) and its report (Markdown) as results/<kind>.
func writeStartReport(t *testing.T, kind string, res any, r startReport) {
	t.Helper()
	benchresults.Save(t, "results", kind, res, r.markdown())
}
