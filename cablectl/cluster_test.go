package cablectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
)

// startBroker runs a real broker on loopback and returns the path of its admin.yaml.
func startClusterTestBroker(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	srv, err := broker.New(t.Context(), broker.Config{DataDir: dir, Listen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatal(err)
	}
	return srv.AdminConfigPath()
}

// runClusterCmd executes cablectl in-process and returns stdout and the error main would turn
// into an exit code.
func runClusterCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := runCmd(t, "", args...)
	return out, err
}

// runCmd is runClusterCmd with stdin, and stderr returned too.
func runCmd(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := NewRoot()
	var out, errOut bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err = root.Execute()
	return out.String(), errOut.String(), err
}

func isClusterUsageErr(err error) bool {
	var ue usageError
	return errors.As(err, &ue) || (err != nil && isCobraUsageError(err))
}

func TestClusterCommandsAgainstARealBroker(t *testing.T) {
	cfg := startClusterTestBroker(t)

	out, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16", "--service-cidr", "10.96.0.0/16", "--labels", "env=prod,site=onprem", "--valid-for", "1h")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("join-token printed %q, want exactly the token and a newline", out)
	}
	claims, err := jointoken.Decode(out)
	if err != nil || claims.Cluster != "east" {
		t.Fatalf("printed token does not decode to cluster east: %+v %v", claims, err)
	}
	if d := time.Until(claims.Expires); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("--valid-for 1h gave a token expiring in %v", d)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "west", "--pod-cidr", "10.2.0.0/16,10.3.0.0/16"); err != nil {
		t.Fatal(err)
	}

	_, err = runClusterCmd(t, "--config", cfg, "cluster", "join-token", "north", "--pod-cidr", "10.1.128.0/17")
	if err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `overlaps pod CIDR 10.1.0.0/16 of cluster "east"`) {
		t.Fatalf("overlap: %v; want a failure (exit 1) naming both clusters", err)
	}
	_, err = runClusterCmd(t, "--config", cfg, "cluster", "join-token", "east", "--pod-cidr", "10.9.0.0/16")
	if err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `cluster "east" already exists with pod CIDRs [10.1.0.0/16]`) {
		t.Fatalf("duplicate: %v", err)
	}

	if out, err := runClusterCmd(t, "--config", cfg, "cluster", "label", "west", "env=dev", "tier=2"); err != nil || !strings.Contains(out, "env=dev,tier=2") {
		t.Fatalf("label: %q %v", out, err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "label", "west", "tier-"); err != nil {
		t.Fatal(err)
	}

	out, err = runClusterCmd(t, "--config", cfg, "cluster", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var view clusterListView
	if err := json.Unmarshal([]byte(out), &view); err != nil {
		t.Fatalf("list -o json is not JSON: %v\n%s", err, out)
	}
	if len(view.Clusters) != 2 || view.Clusters[0].Name != "east" || view.Clusters[0].ID != 1 || view.Clusters[1].ID != 2 ||
		view.Clusters[1].Labels["env"] != "dev" || view.Clusters[1].Labels["tier"] != "" || len(view.Clusters[1].PodCIDRs) != 2 {
		t.Fatalf("list -o json: %+v", view)
	}
	out, err = runClusterCmd(t, "--config", cfg, "cluster", "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[1], "env=prod,site=onprem") || !strings.Contains(lines[2], "10.2.0.0/16,10.3.0.0/16") {
		t.Fatalf("list table:\n%s", out)
	}
	if out, err := runClusterCmd(t, "--config", cfg, "cluster", "list", "-o", "yaml"); err != nil || !strings.Contains(out, "name: west") {
		t.Fatalf("list -o yaml: %q %v", out, err)
	}

	if out, err := runClusterCmd(t, "--config", cfg, "cluster", "remove", "west"); err != nil || !strings.Contains(out, "cluster west (id 2) removed") {
		t.Fatalf("remove: %q %v", out, err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "remove", "west"); err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `cluster "west" not found`) {
		t.Fatalf("second remove: %v", err)
	}
}

func TestClusterCommandsRefuseBadUsageBeforeDialling(t *testing.T) {
	// No broker runs: each of these must fail as usage (exit 2) without trying to connect.
	cfg := filepath.Join(t.TempDir(), "missing.yaml")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a bad cluster name", []string{"cluster", "join-token", "East_1", "--pod-cidr", "10.1.0.0/16"}, `cluster name "East_1"`},
		{"a CIDR with host bits", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.1/16"}, "did you mean 10.1.0.0/16"},
		{"bad labels", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16", "--labels", "env"}, `label "env" is not key=value`},
		{"a zero validity", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16", "--valid-for", "0s"}, "--valid-for"},
		{"no cluster name", []string{"cluster", "join-token", "--pod-cidr", "10.1.0.0/16"}, "needs NAME"},
		{"an unknown output format", []string{"cluster", "list", "-o", "xml"}, `--output "xml"`},
		{"label without changes", []string{"cluster", "label", "east"}, "at least one label change"},
		{"a malformed label change", []string{"cluster", "label", "east", "env"}, "neither key=value nor key-"},
		{"remove without a name", []string{"cluster", "remove"}, "needs NAME"},
		{"an unknown flag", []string{"cluster", "list", "--bogus"}, "unknown flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runClusterCmd(t, append([]string{"--config", cfg}, tt.args...)...)
			if !isClusterUsageErr(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a usage error containing %q", err, tt.want)
			}
		})
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "list"); err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("a missing admin config: %v, want a failure naming the file", err)
	}
}

func TestClusterTableGolden(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	resp := &apiv1.ListClustersResponse{
		Revision: 9,
		Clusters: []*apiv1.Cluster{
			{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, Labels: map[string]string{"env": "prod", "site": "onprem"}, JoinedAt: timestamppb.New(now.Add(-49 * time.Hour))},
			{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16", "10.3.0.0/16"}, JoinedAt: timestamppb.New(now.Add(-90 * time.Second)), GatewayMode: true},
		},
		Endpoints: []*apiv1.Endpoint{
			{Cluster: "east", Node: "gw2", PrivateIp: "192.0.2.2"},
			{Cluster: "east", Node: "gw1", PrivateIp: "192.0.2.1"},
			{Cluster: "west", Node: "gw1", PrivateIp: "192.0.2.3", MeshAddress: "242.0.0.1"},
		},
	}
	var buf bytes.Buffer
	if err := printClusters(&buf, "table", resp, now); err != nil {
		t.Fatal(err)
	}
	golden(t, "cluster-list.golden", buf.Bytes())

	// JSON and YAML say the mode of every cluster and the mesh address of every gateway that has one.
	for _, format := range []string{"json", "yaml"} {
		buf.Reset()
		if err := printClusters(&buf, format, resp, now); err != nil {
			t.Fatal(err)
		}
		out := strings.ReplaceAll(buf.String(), `"`, "")
		for _, want := range []string{"gatewayMode: false", "gatewayMode: true", "meshAddress: 242.0.0.1"} {
			if !strings.Contains(out, want) {
				t.Errorf("-o %s does not contain %q:\n%s", format, want, buf.String())
			}
		}
		if strings.Count(out, "meshAddress") != 1 {
			t.Errorf("-o %s: a gateway without a mesh address shows one:\n%s", format, buf.String())
		}
	}
}

// TestClusterFlagErrorsSayWhatTheBrokerSays: cablectl refuses a bad cluster name, CIDR or label
// itself, as bad usage (exit 2) naming the flag and the value and without dialling (its admin
// config does not exist), and its message holds the broker's own for the same value.
func TestClusterFlagErrorsSayWhatTheBrokerSays(t *testing.T) {
	admin := dialTestBroker(t, startClusterTestBroker(t))
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	joinToken := func(req *apiv1.CreateJoinTokenRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := admin.CreateJoinToken(ctx, req); return err }
	}
	label := func(req *apiv1.LabelClusterRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := admin.LabelCluster(ctx, req); return err }
	}
	pods := []string{"10.1.0.0/16"}
	tests := []struct {
		name   string
		args   []string
		flag   string // the flag the message names first, if the value came from one
		broker func(context.Context) error
	}{
		{"a join token for a cluster name that is not a DNS label", []string{"cluster", "join-token", "East_1", "--pod-cidr", "10.1.0.0/16"}, "",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "East_1", PodCidrs: pods})},
		{"a join token for a cluster name longer than 63 characters", []string{"cluster", "join-token", strings.Repeat("a", 64), "--pod-cidr", "10.1.0.0/16"}, "",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: strings.Repeat("a", 64), PodCidrs: pods})},
		{"a pod CIDR with host bits", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.1/16"}, "--pod-cidr",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.1/16"}})},
		{"a pod CIDR that is not a CIDR", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0"}, "--pod-cidr",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0"}})},
		{"pod CIDRs that overlap each other", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16,10.1.128.0/17"}, "--pod-cidr",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16", "10.1.128.0/17"}})},
		{"a service CIDR with host bits", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16", "--service-cidr", "10.96.0.1/12"}, "--service-cidr",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: pods, ServiceCidrs: []string{"10.96.0.1/12"}})},
		{"a label value with a space", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16", "--labels", "env=pro duction"}, "--labels",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: pods, Labels: map[string]string{"env": "pro duction"}})},
		{"a label key that ends in '_'", []string{"cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16", "--labels", "env_=prod"}, "--labels",
			joinToken(&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: pods, Labels: map[string]string{"env_": "prod"}})},
		{"labelling a cluster name that is not a DNS label", []string{"cluster", "label", "East_1", "env=prod"}, "",
			label(&apiv1.LabelClusterRequest{Name: "East_1", Set: map[string]string{"env": "prod"}})},
		{"setting a label with a bad value", []string{"cluster", "label", "east", "env=-prod"}, "",
			label(&apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"env": "-prod"}})},
		{"removing a label with a bad key", []string{"cluster", "label", "east", "env_-"}, "",
			label(&apiv1.LabelClusterRequest{Name: "east", Remove: []string{"env_"}})},
		{"setting and removing the same label", []string{"cluster", "label", "east", "env=prod", "env-"}, "",
			label(&apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"env": "prod"}, Remove: []string{"env"}})},
		{"removing a cluster name that is not a DNS label", []string{"cluster", "remove", "east.1"}, "",
			func(ctx context.Context) error {
				_, err := admin.RemoveCluster(ctx, &apiv1.RemoveClusterRequest{Name: "east.1"})
				return err
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			brokerErr := tt.broker(context.Background())
			st, _ := status.FromError(brokerErr)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("the broker answered %v, want InvalidArgument", brokerErr)
			}
			_, err := runClusterCmd(t, append([]string{"--config", missing}, tt.args...)...)
			if !isClusterUsageErr(err) {
				t.Fatalf("got %v, want a usage error (exit 2) before dialling", err)
			}
			if !strings.HasPrefix(err.Error(), tt.flag) || !strings.Contains(err.Error(), st.Message()) {
				t.Fatalf("cablectl said %q; want %q first and the broker's %q", err, tt.flag, st.Message())
			}
		})
	}
}

// dialTestBroker is an admin client of the broker whose admin.yaml is cfg.
func dialTestBroker(t *testing.T, cfg string) apiv1.AdminClient {
	t.Helper()
	c, err := adminconfig.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := adminconfig.Dial(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return apiv1.NewAdminClient(conn)
}

func TestClusterJoinTokenGatewayMode(t *testing.T) {
	cfg := startClusterTestBroker(t)
	for _, c := range []string{"east", "west"} {
		if _, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", c, "--pod-cidr", "10.1.0.0/16", "--gateway-mode"); err != nil {
			t.Fatalf("gateway-mode %s on 10.1.0.0/16: %v", c, err)
		}
	}
	_, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "north", "--pod-cidr", "10.1.0.0/16")
	if err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `overlaps pod CIDR 10.1.0.0/16 of cluster "east"`) || !strings.Contains(err.Error(), "--gateway-mode") {
		t.Fatalf("a direct cluster on a gateway-mode cluster's CIDR: %v; want a failure naming both and hinting --gateway-mode", err)
	}
	_, err = runClusterCmd(t, "--config", cfg, "cluster", "join-token", "east")
	if err == nil || !strings.Contains(err.Error(), `cluster "east" already exists in gateway mode, not direct mode`) {
		t.Fatalf("a token for east without --gateway-mode: %v", err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "east", "--gateway-mode"); err != nil {
		t.Fatalf("another token for east: %v", err)
	}
	out, err := runClusterCmd(t, "--config", cfg, "cluster", "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "MODE") || !strings.Contains(lines[1], "gateway") || !strings.Contains(lines[2], "gateway") {
		t.Fatalf("list table:\n%s", out)
	}
}
