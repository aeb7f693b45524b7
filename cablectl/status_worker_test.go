package cablectl

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

func TestStatusTableShowsAWorkersGatewaysAndRoutes(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	ok := now.Add(-3 * time.Second)
	wk := &statusapi.Worker{ProbePeriodMs: 500, FailureThreshold: 3,
		Gateways: []statusapi.WorkerGateway{
			{Node: "east-gw1", Address: "172.31.0.10", Probing: true, ProbesSent: 20, ProbesFailed: 4, ConsecutiveFailures: 4, LastError: "timeout after 500ms", LastSuccess: &ok},
			{Node: "east-gw2", Address: "172.31.0.12", Probing: true, Healthy: true, ProbesSent: 20, RTTMs: 0.25, LastSuccess: &now},
		},
		Routes: []statusapi.WorkerRoute{{Cluster: "west", Via: "east-gw2", Address: "172.31.0.12", Carriers: []string{"east-gw1", "east-gw2"},
			Subnets: []string{"10.2.0.0/16"}, Reason: "gateway east-gw1 does not answer this node's probes"}},
	}
	var b bytes.Buffer
	if err := printWorkerSection(&b, wk, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"probed every 500ms, unhealthy after 3 failures",
		"down (4 failures: timeout after 500ms)", "4/20 failed", "3s ago",
		"east-gw2  172.31.0.12  healthy", "0.2ms",
		"west     east-gw2 (172.31.0.12)  east-gw1,east-gw2  10.2.0.0/16  gateway east-gw1 does not answer",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("worker section lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := printWorkerSection(&b, nil, now); err != nil || b.Len() != 0 {
		t.Errorf("a gateway's status (no worker section) printed %q, %v", b.String(), err)
	}
}
