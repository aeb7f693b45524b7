package metricsdoc

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMissingNamesAbsentRowsAndLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "a"}, []string{"cluster", "driver"}))
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "b", Help: "b"}))
	fams, err := Families(reg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fams["a_total"], []string{"cluster", "driver"}) || len(fams) != 2 {
		t.Fatalf("families %v", fams)
	}
	readme := "| `a_total` | `cluster` |\n"
	got := Missing(readme, fams)
	want := []string{
		"docs/metrics.md's row for a_total does not name its label `driver`: | `a_total` | `cluster` |",
		"docs/metrics.md's metrics table has no row | `b` |",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Missing = %q, want %q", got, want)
	}
	if m := Missing("| `a_total` | `cluster`, `driver` |\n| `b` | |\n", fams); m != nil {
		t.Errorf("a complete table: %q", m)
	}
}
