// Package metricsdoc checks that a document's metrics table (docs/metrics.md) names every metric family a
// Prometheus collector describes, with its labels: the agent's and the broker's tests share it.
package metricsdoc

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// descRE reads a Desc's String(): client_golang exposes a Desc's name and variable labels
// only there.
var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// Families lists every metric family c describes, with its variable labels.
func Families(c prometheus.Collector) (map[string][]string, error) {
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	out := map[string][]string{}
	var err error
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			if err == nil {
				err = fmt.Errorf("cannot read %s", d)
			}
			continue
		}
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		out[m[1]] = labels
	}
	return out, err
}

// Missing returns what readme's table lacks for families: a row "| `name` |" per family, and
// each of its labels named in that row.
func Missing(readme string, families map[string][]string) []string {
	names := make([]string, 0, len(families))
	for n := range families {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, name := range names {
		row := Row(readme, name)
		if row == "" {
			out = append(out, fmt.Sprintf("docs/metrics.md's metrics table has no row | `%s` |", name))
			continue
		}
		for _, l := range families[name] {
			if !strings.Contains(row, "`"+l+"`") {
				out = append(out, fmt.Sprintf("docs/metrics.md's row for %s does not name its label `%s`: %s", name, l, row))
			}
		}
	}
	return out
}

// Row returns the table row that starts with | `name` |, "" when there is none.
func Row(readme, name string) string {
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "| `"+name+"` |") {
			return l
		}
	}
	return ""
}
