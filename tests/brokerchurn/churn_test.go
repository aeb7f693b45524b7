// Package brokerchurn runs the cable-broker binary on loopback (no root needed) and churns one
// agent identity's service exports at the documented limits, reading the broker's RSS.
package brokerchurn

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// binaries is where cable-broker and cablectl are: $CABLEMESH_BIN (make build; then
// CABLEMESH_BIN=$PWD/bin).
func binaries(t *testing.T) string {
	dir := os.Getenv("CABLEMESH_BIN")
	if dir == "" {
		t.Skip("skipping: set CABLEMESH_BIN to the directory of the built binaries (make build)")
	}
	return dir
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// rssBytes is the resident set of process pid (VmRSS).
func rssBytes(t *testing.T, pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/pid/status")
	return 0
}

// startBroker runs cable-broker with its state in dir on addr until the test ends.
func startBroker(t *testing.T, bin, dir, addr string) *exec.Cmd {
	logf, err := os.Create(filepath.Join(dir, "broker.log"))
	if err != nil {
		t.Fatal(err)
	}
	// The per-cluster export quota would refuse one node's 512 x 128 endpoints first: lifted,
	// since this measures the broker's memory.
	cmd := exec.Command(filepath.Join(bin, "cable-broker"), "--data-dir", dir, "--listen", addr,
		"--max-services-per-cluster", "1048576", "--max-endpoints-per-cluster", "16777216",
		"--max-service-map-entries-per-cluster", "16777216")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("broker log (tail):\n%s", tail(b, 3000))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "admin.yaml")); err == nil {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				return cmd
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("broker not ready in 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// TestBrokerRSSStaysFlatUnderExportChurn: one agent of cluster east (pod CIDR 10.1.0.0/16)
// writes 512 exports of 128 endpoints and withdraws them, 8 times; the broker's RSS after round
// 8 must be within 160 MB of round 2 (98843a3: 30 MB at start, 413, 659, 812, 1,103 ... MB, by
// the account).
func TestBrokerRSSStaysFlatUnderExportChurn(t *testing.T) {
	bin := binaries(t)
	dir, addr := t.TempDir(), freePort(t)
	broker := startBroker(t, bin, dir, addr)

	out, err := exec.Command(filepath.Join(bin, "cablectl"), "--config", filepath.Join(dir, "admin.yaml"),
		"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16").Output()
	if err != nil {
		t.Fatalf("cablectl cluster join-token: %v", err)
	}
	agentDir := t.TempDir()
	tokenFile := filepath.Join(agentDir, "token")
	if err := os.WriteFile(tokenFile, bytes.TrimSpace(out), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	id, _, err := brokerclient.Join(ctx, brokerclient.JoinParams{Broker: addr, Cluster: "east", Node: "gw1", TokenFile: tokenFile, StateDir: agentDir})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(id.TLSConfig())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agent := apiv1.NewAgentClient(conn)

	exports := make([]*apiv1.ServiceExport, 512)
	for i := range exports {
		e := &apiv1.ServiceExport{Namespace: "churn", Name: fmt.Sprintf("svc-%03d", i),
			Ports: []*apiv1.ServicePort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
		for j := range 128 {
			n := i*128 + j
			e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.1.%d.%d", n>>8, n&0xff), Ready: true})
		}
		exports[i] = e
	}
	rss := make([]uint64, 8)
	t.Logf("start: broker RSS %.0f MB", float64(rssBytes(t, broker.Process.Pid))/1e6)
	for r := range rss {
		resp, err := agent.SetExports(ctx, &apiv1.SetExportsRequest{Exports: exports})
		if err != nil || len(resp.GetExports()) != len(exports) {
			t.Fatalf("round %d: set %d exports: %d stored, %v", r+1, len(exports), len(resp.GetExports()), err)
		}
		if _, err := agent.SetExports(ctx, &apiv1.SetExportsRequest{}); err != nil {
			t.Fatalf("round %d: withdraw the exports: %v", r+1, err)
		}
		time.Sleep(time.Second) // the import tracker and the watchers catch up
		rss[r] = rssBytes(t, broker.Process.Pid)
		t.Logf("round %d: broker RSS %.0f MB", r+1, float64(rss[r])/1e6)
	}
	const slack = 160 << 20
	if rss[7] > rss[1]+slack {
		t.Errorf("broker RSS %.0f MB after round 8, %.0f MB after round 2: grew by more than %d MiB", float64(rss[7])/1e6, float64(rss[1])/1e6, slack>>20)
	}
}
