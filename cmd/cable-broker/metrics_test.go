package main

import (
	"bytes"
	"strings"
	"testing"
)

// A --metrics-listen that cannot be listened on stops the broker before it serves (exit 1,
// naming the flag), rather than run without the probes its Deployment depends on.
func TestAMetricsListenThatCannotListenFails(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "192.0.2.254:0"}, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "metricsListen=192.0.2.254:0") {
		t.Fatalf("exit %d, stderr %q; want 1 naming metricsListen", code, stderr.String())
	}
}
