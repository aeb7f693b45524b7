// Package benchresults writes a benchmark's results where every bench under bench/ writes them:
// $CABLEMESH_BENCH_RESULTS (default bench/results), as <kind>-<UTC time>.json (the data) and .md
// (the table a reader compares with its anchor), one pair per run.
package benchresults

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Env names the results directory's environment variable.
const Env = "CABLEMESH_BENCH_RESULTS"

// Save writes res as JSON and markdown beside it, in $CABLEMESH_BENCH_RESULTS or else
// defaultDir (the bench package's path to bench/results), and logs where.
func Save(t testing.TB, defaultDir, kind string, res any, markdown string) {
	t.Helper()
	base, err := write(os.Getenv(Env), defaultDir, kind, time.Now(), res, markdown)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("results: %s.json and %s.md\n%s", base, base, markdown)
}

// write is Save without the test: it returns the files' common path without the extension.
func write(dir, defaultDir, kind string, now time.Time, res any, markdown string) (string, error) {
	if dir == "" {
		dir = defaultDir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := filepath.Join(dir, kind+"-"+now.UTC().Format("2006-01-02T150405Z"))
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return "", err
	}
	return base, errors.Join(os.WriteFile(base+".json", append(js, '\n'), 0o644), os.WriteFile(base+".md", []byte(markdown), 0o644))
}
