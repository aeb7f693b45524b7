package agent

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/cablemesh/cablemesh/internal/metricsdoc"
)

// TestReadmeListsEveryAgentMetric keeps README.md's metrics table in step with the agent: every
// family the agent's registry describes has a row "| `name` | labels |" naming each label.
func TestReadmeListsEveryAgentMetric(t *testing.T) {
	b := newBroker(t)
	a, err := New(Options{Config: testConfig(t, b, true), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	fams, err := metricsdoc.Families(a.registry)
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
