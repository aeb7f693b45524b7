package k8s

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// eastConflictingWeb is a headless web in east, exported: west's web (ClusterSetIP) is older, so
// east's export is left out of the import with a type conflict.
const eastConflictingWeb = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: None
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: web, namespace: demo}
`

const westGatewayPod = `apiVersion: v1
kind: Pod
metadata: {name: server-gw, namespace: demo}
spec:
  nodeSelector: {cablemesh.io/gateway: "true"}
  containers:
  - {name: c, image: docker.io/cablemesh/k8s-probe:test, imagePullPolicy: Never, args: [serve, -text, hello from west gw]}
`

// gatewayRTT is the p50 round-trip time to remote that the gateway of cluster c measures
// (cablectl status on its socket), "" without samples.
func (m *mesh) gatewayRTT(c, remote string) (string, error) {
	st, err := m.gatewayView(c)
	if err != nil {
		return "", err
	}
	for _, cn := range st.Connections {
		if cn.Cluster == remote && cn.RTT != nil && cn.Health != nil && cn.Health.Samples > 0 {
			return fmt.Sprintf("%.2fms", cn.RTT.P50Ms), nil
		}
	}
	return "", nil
}

// quietPolicy is a ClusterConnectionPolicy applied in east that selects no cluster of the mesh
// (so it changes no connection): driver is what generation changes.
func quietPolicy(driver string) string {
	return `apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata:
  name: quiet
  labels: {cablemesh.io/origin: cluster}
spec:
  clusterSelector: {matchLabels: {cablemesh.io/nowhere: "true"}}
  priority: 5
  cableDriver: {name: ` + driver + `}
`
}

// TestKubeStatus: each cluster's elected gateway keeps a ClusterLink of the other cluster with
// its latency (kubectl get clusterlinks), writes the status of a ClusterConnectionPolicy applied
// in its cluster with the generation the broker holds, and a ServiceExport the broker finds in
// conflict gets the MCS Conflict condition.
func TestKubeStatus(t *testing.T) {
	requireStage(t)
	m := upMesh(t)
	m.mustKC("west", westApps, "apply", "-f", "-")
	m.mustKC("east", eastApps, "apply", "-f", "-")

	// A pod on west's gateway too, so that both gateways hold an address in their pod CIDR (the
	// CNI bridge's), which the other side's health probes target.
	m.mustKC("west", westGatewayPod, "apply", "-f", "-")
	for _, c := range [][2]string{{"east", "west"}, {"west", "east"}} {
		local, remote := c[0], c[1]
		d := waitFor(t, 120*time.Second, local+"'s ClusterLink "+remote+" connected", func() error {
			out, err := m.kc(local, "", "get", "clusterlink", remote, "-o", "jsonpath={.status.state} {.status.alive} {.status.driver}")
			if f := strings.Fields(out); err != nil || len(f) != 3 || f[0] != "connected" || f[1] != "true" {
				return fmt.Errorf("state, alive, driver: %q (%v)", out, err)
			}
			return nil
		})
		// The latency is the gateway's probes' (cablectl status): the ClusterLink shows it once
		// they have samples, within the 30 s a change of latency alone may wait.
		rtt := ""
		for deadline := time.Now().Add(60 * time.Second); rtt == "" && time.Now().Before(deadline); time.Sleep(time.Second) {
			var err error
			if rtt, err = m.gatewayRTT(local, remote); err != nil {
				t.Fatal(err)
			}
		}
		if rtt == "" {
			t.Errorf("%s's gateway has no probe samples of %s after 60 s: the ClusterLink shows no latency", local, remote)
		} else {
			waitFor(t, 60*time.Second, local+"'s ClusterLink "+remote+" with the probes' latency", func() error {
				out, err := m.kc(local, "", "get", "clusterlink", remote, "-o", "jsonpath={.status.latencyP50} {.status.latencyP99}")
				if f := strings.Fields(out); err != nil || len(f) != 2 || !strings.HasSuffix(f[0], "ms") || !strings.HasSuffix(f[1], "ms") {
					return fmt.Errorf("the gateway measures p50 %s, the ClusterLink's p50, p99: %q (%v)", rtt, out, err)
				}
				return nil
			})
		}
		out := m.mustKC(local, "", "get", "clusterlinks")
		t.Logf("%s (connected after %v): kubectl get clusterlinks\n%s", local, d.Round(time.Millisecond), out)
		header := strings.Fields(strings.SplitN(out, "\n", 2)[0])
		want := []string{"NAME", "DRIVER", "STATE", "ALIVE", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99", "SERVICES", "AGE"}
		if strings.Join(header, " ") != strings.Join(want, " ") || !strings.Contains(out, remote) {
			t.Errorf("%s: kubectl get clusterlinks columns %v, want %v, and a row of %s", local, header, want, remote)
		}
	}
	// west's web, exported, is one service east imports from west.
	waitFor(t, 60*time.Second, "east's ClusterLink west counting west's web", func() error {
		out, err := m.kc("east", "", "get", "clusterlink", "west", "-o", "jsonpath={.status.services}")
		if err != nil || strings.TrimSpace(out) != "1" {
			return fmt.Errorf("services %q (%v)", out, err)
		}
		return nil
	})

	m.mustKC("east", quietPolicy("vxlan"), "apply", "-f", "-")
	waitFor(t, 90*time.Second, "east's ClusterConnectionPolicy quiet with its status at generation 1", func() error {
		out, err := m.kc("east", "", "get", "clusterconnectionpolicy", "quiet", "-o",
			"jsonpath={.metadata.generation} {.status.observedGeneration} {.status.pairsDecided} {.status.syncedAs}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		f := strings.Fields(out)
		if len(f) != 4 || f[0] != "1" || f[1] != "1" || f[2] != "0" || !strings.HasPrefix(f[3], "quiet-") {
			return fmt.Errorf("generation, observedGeneration, pairsDecided, syncedAs: %q", out)
		}
		return nil
	})
	m.mustKC("east", quietPolicy("wireguard"), "apply", "-f", "-")
	d := waitFor(t, 90*time.Second, "the status following generation 2", func() error {
		out, err := m.kc("east", "", "get", "clusterconnectionpolicy", "quiet", "-o", "jsonpath={.metadata.generation} {.status.observedGeneration}")
		if f := strings.Fields(out); err != nil || len(f) != 2 || f[0] != "2" || f[1] != "2" {
			return fmt.Errorf("generation, observedGeneration: %q (%v)", out, err)
		}
		return nil
	})
	t.Logf("observedGeneration 2 after %v", d.Round(time.Millisecond))
	m.mustKC("east", "", "delete", "clusterconnectionpolicy", "quiet")

	// A conflicting export in east: Conflict=True on east's, NoConflicts on west's.
	m.mustKC("east", eastConflictingWeb, "apply", "-f", "-")
	d = waitFor(t, 90*time.Second, "east's ServiceExport web with Conflict=True TypeConflict", func() error {
		out, err := m.kc("east", "", "-n", "demo", "get", "serviceexport", "web", "-o",
			`jsonpath={.status.conditions[?(@.type=="Conflict")].status} {.status.conditions[?(@.type=="Conflict")].reason}`)
		if strings.TrimSpace(out) != "True TypeConflict" || err != nil {
			return fmt.Errorf("Conflict condition %q (%v)", out, err)
		}
		return nil
	})
	msg := m.mustKC("east", "", "-n", "demo", "get", "serviceexport", "web", "-o", `jsonpath={.status.conditions[?(@.type=="Conflict")].message}`)
	t.Logf("east's ServiceExport web in conflict after %v: %s", d.Round(time.Millisecond), msg)
	waitFor(t, 60*time.Second, "west's ServiceExport web with Conflict=False NoConflicts", func() error {
		out, err := m.kc("west", "", "-n", "demo", "get", "serviceexport", "web", "-o",
			`jsonpath={.status.conditions[?(@.type=="Conflict")].status} {.status.conditions[?(@.type=="Conflict")].reason}`)
		if strings.TrimSpace(out) != "False NoConflicts" || err != nil {
			return fmt.Errorf("Conflict condition %q (%v)", out, err)
		}
		return nil
	})
	m.mustKC("east", "", "-n", "demo", "delete", "serviceexport", "web")
	m.mustKC("east", "", "-n", "demo", "delete", "service", "web")
}
