// Package netns holds Cablemesh's end-to-end tests: whole meshes of clusters built from network
// namespaces on this machine, running the real cable-broker, cable-agent and cablectl binaries.
// They need root and skip without it. See tests/netns/harness for the layout.
package netns

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/cablemesh/cablemesh/internal/tooldeps"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		// Every program the suite runs (scripts/deps.list, stage netns) is checked before the
		// first test, so that a missing one fails here, named with its package, rather than
		// as an "exec: not found" deep inside one test minutes in.
		if err := tooldeps.CheckStage(".", "netns", "test"); err != nil {
			fmt.Fprintln(os.Stderr, "netns:", err)
			os.Exit(1)
		}
		// Leftovers of earlier runs that crashed (their test process is gone) go first.
		if removed, err := harness.SweepStale(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "netns: sweep of leftovers of crashed runs:", err)
		} else if len(removed) > 0 {
			fmt.Fprintln(os.Stderr, "netns: removed leftovers (namespaces, temp dirs) of crashed runs:", removed)
		}
	}
	code := m.Run()
	harness.RemoveBuild()
	os.Exit(code)
}
