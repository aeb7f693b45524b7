package agent

import (
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// metricFamilies lists every metric a collector describes, with its labels.
func metricFamilies(t *testing.T, c prometheus.Collector) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	out := map[string][]string{}
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		out[m[1]] = labels
	}
	return out
}

// TestReadmeListsEveryAgentMetric keeps README.md's metrics table in step with the agent: every
// family the agent's registry describes has a row "| `name` | labels |" naming each label.
func TestReadmeListsEveryAgentMetric(t *testing.T) {
	b := newBroker(t)
	a, err := New(Options{Config: testConfig(t, b, true), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	fams := metricFamilies(t, a.registry)
	if len(fams) < 5 {
		t.Fatalf("only %d metric families described: %v", len(fams), fams)
	}
	for name, labels := range fams {
		row := readmeRow(string(readme), name)
		if row == "" {
			t.Errorf("README.md's metrics table has no row | `%s` |", name)
			continue
		}
		for _, l := range labels {
			if !strings.Contains(row, "`"+l+"`") {
				t.Errorf("README.md's row for %s does not name its label `%s`: %s", name, l, row)
			}
		}
	}
}

// readmeRow returns the table row that starts with | `name` |.
func readmeRow(readme, name string) string {
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "| `"+name+"` |") {
			return l
		}
	}
	return ""
}
