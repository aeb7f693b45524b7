package broker

import (
	"os"
	"testing"

	"github.com/cablemesh/cablemesh/internal/metricsdoc"
)

// TestReadmeListsEveryBrokerMetric keeps docs/metrics.md's metrics table in step with the broker.
func TestReadmeListsEveryBrokerMetric(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	readme, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	fams, err := metricsdoc.Families(b.srv.metrics.reg)
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) < 5 {
		t.Fatalf("only %d metric families described: %v", len(fams), fams)
	}
	for _, m := range metricsdoc.Missing(string(readme), fams) {
		t.Error(m)
	}
}
