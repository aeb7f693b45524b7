package broker

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

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

// TestReadmeListsEveryBrokerMetric keeps README.md's metrics table in step with the broker.
func TestReadmeListsEveryBrokerMetric(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	fams := metricFamilies(t, b.srv.metrics.reg)
	if len(fams) < 5 {
		t.Fatalf("only %d metric families described: %v", len(fams), fams)
	}
	for name, labels := range fams {
		var row string
		for _, l := range strings.Split(string(readme), "\n") {
			if strings.HasPrefix(l, "| `"+name+"` |") {
				row = l
			}
		}
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
