package netns

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// The xDS server hands out the ingress's private key (SDS). These tests attack it as a local
// user would: uid 65534 (nobody) fetches the secret, the secret's certificate calls the broker,
// and thousands of made-up node IDs try to grow the server's node table.

// nobody is the unprivileged uid and gid the attacks run as.
const nobody = 65534

// envoyGID is the group the tests allow on the xDS socket (ingress.xds.allowGID).
const envoyGID = 65533

// sdsSecret is what `xdsgrpc secrets` prints.
type sdsSecret struct {
	Name string `json:"name"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// fetchSecretAs runs `xdsgrpc secrets` against the xDS server at target as uid/gid (with the
// supplementary groups). Without ns it runs here, its credentials set by exec
// (syscall.Credential): a unix socket is not in any network namespace. With ns (a TCP target on
// that namespace's loopback) it runs through `ip netns exec` and setpriv.
func fetchSecretAs(ctx context.Context, bin, ns, target string, uid, gid uint32, groups []uint32) (*sdsSecret, string, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	args := []string{"secrets", "-target", target, "-node", fmt.Sprintf("attacker-%d", uid), "-duration", "5s"}
	var cmd *exec.Cmd
	if ns == "" {
		cmd = exec.CommandContext(cctx, bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	} else {
		priv := []string{"netns", "exec", ns, "setpriv", "--reuid", fmt.Sprint(uid), "--regid", fmt.Sprint(gid), "--clear-groups"}
		cmd = exec.CommandContext(cctx, "ip", append(append(priv, bin), args...)...)
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String(), err
	}
	var s sdsSecret
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		return nil, stderr.String(), fmt.Errorf("xdsgrpc secrets output %q: %w", out.String(), err)
	}
	return &s, stderr.String(), nil
}

// brokerCall makes one Agent call (Heartbeat of node) at the broker from namespace ns,
// presenting certPEM/keyPEM (`xdsgrpc heartbeat`, run there: the test process stays out of
// the namespaces).
func brokerCall(m *harness.Mesh, bin, ns, stateDir, node string, certPEM, keyPEM []byte) error {
	dir, err := os.MkdirTemp(m.Dir, "call-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cert, key := filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key")
	if err := os.WriteFile(cert, certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		return err
	}
	r := harness.NSRun(m.Ctx, ns, bin, "heartbeat", "-target", m.BrokerAddress(), "-node", node, "-cert", cert, "-key", key, "-ca", filepath.Join(stateDir, brokerclient.CAFile))
	if r.Err != nil {
		return fmt.Errorf("%s", strings.TrimSpace(r.Stderr))
	}
	return nil
}

// runDir is a directory every user may traverse (t.TempDir is 0700), for the xDS socket.
func runDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/run", "cm-xds-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// publicCopy copies the binary at bin into dir (0755), where an unprivileged uid may run it
// (the mesh's directory is 0700).
func publicCopy(t *testing.T, bin, dir string) string {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(bin))
	if err := os.WriteFile(out, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestXDSLoopbackTCPIsRefused: with ingress.xds.listen on loopback TCP, any local user could
// fetch the ingress key. The agent must refuse the config at load (naming the field and value);
// if it serves instead, uid 65534 tries to fetch the secret over TCP, and the test reports what
// it got.
func TestXDSLoopbackTCPIsRefused(t *testing.T) {
	m := harness.New(t)
	bin := publicCopy(t, nstest.Binary(t, m.Dir, "./tests/netns/cmd/xdsgrpc"), runDir(t))
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", "ingress: {mode: envoy, xds: {listen: \"127.0.0.1:18000\"}}\n")
	east.StartAgent("--cleanup-on-exit")
	var code int
	err := harness.WaitFor(20*time.Second, 100*time.Millisecond, func() (bool, string) {
		exited, c := east.Agent.Exited()
		code = c
		return exited, "agent still running"
	})
	if err == nil {
		log := east.Agent.Log()
		if code == 0 || !strings.Contains(log, `ingress.xds.listen: "127.0.0.1:18000" is a TCP address`) {
			t.Fatalf("agent exited %d without naming ingress.xds.listen and its value:\n%s", code, east.Agent.LogTail(20))
		}
		return
	}
	// The agent runs on loopback TCP: show what a local user gets.
	var got *sdsSecret
	_ = harness.WaitFor(30*time.Second, 500*time.Millisecond, func() (bool, string) {
		s, stderr, err := fetchSecretAs(m.Ctx, bin, east.GwNS, "127.0.0.1:18000", nobody, nobody, nil)
		got = s
		return err == nil, stderr
	})
	if got == nil {
		t.Fatalf("the agent accepted ingress.xds.listen 127.0.0.1:18000 (it should refuse it at load); uid %d could not fetch a secret", nobody)
	}
	agentKey, _ := os.ReadFile(filepath.Join(east.StateDir, brokerclient.KeyFile))
	t.Fatalf("the agent serves xDS on loopback TCP: uid %d fetched secret %s (it is agent.key: %v)", nobody, got.Name, strings.TrimSpace(got.Key) == strings.TrimSpace(string(agentKey)))
}

// TestXDSSocketAdmitsByPeerCredentials: the xDS socket admits root and the allowed group
// (ingress.xds.allowGID) only, by SO_PEERCRED whatever the file's permissions let through; the
// socket file is 0660 and the group's.
func TestXDSSocketAdmitsByPeerCredentials(t *testing.T) {
	m := harness.New(t)
	run := runDir(t)
	bin := publicCopy(t, nstest.Binary(t, m.Dir, "./tests/netns/cmd/xdsgrpc"), run)
	sock := filepath.Join(run, "xds.sock")
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", fmt.Sprintf("ingress: {mode: envoy, xds: {listen: %q, allowGID: %d}}\n", sock, envoyGID))
	east.StartAgent("--cleanup-on-exit")
	target := "unix://" + sock
	if err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
		_, stderr, err := fetchSecretAs(m.Ctx, bin, "", target, 0, 0, nil)
		if err != nil {
			if exited, code := east.Agent.Exited(); exited {
				return false, fmt.Sprintf("agent exited %d: %s", code, east.Agent.LogTail(5))
			}
		}
		// Without a broker there is no ingress certificate: the server answers all the same.
		return err == nil || strings.Contains(stderr, "no TLS certificate secret"), stderr
	}); err != nil {
		t.Fatalf("root cannot use the xDS socket: %v", err)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != envoyGID {
		t.Errorf("socket mode %v gid %d, want 0660 and gid %d", fi.Mode().Perm(), st.Gid, envoyGID)
	}
	t.Run("a user outside the allowed group is refused", func(t *testing.T) {
		// Supplementary group envoyGID gets it through the file's permissions; the peer check
		// (the effective gid) still refuses it.
		_, stderr, err := fetchSecretAs(m.Ctx, bin, "", target, nobody, nobody, []uint32{envoyGID})
		if err == nil || strings.Contains(stderr, "no TLS certificate secret") {
			t.Fatalf("uid %d gid %d was served: %v %s", nobody, nobody, err, stderr)
		}
		m.Logf("uid %d refused: %v %s", nobody, err, strings.TrimSpace(stderr))
		st, err := east.Status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Ingress.XDS.RefusedConnections == 0 || !strings.Contains(st.Ingress.XDS.LastRefused, fmt.Sprintf("uid %d", nobody)) {
			t.Errorf("status counts %d refused connections, last %q; want uid %d's", st.Ingress.XDS.RefusedConnections, st.Ingress.XDS.LastRefused, nobody)
		}
	})

	t.Run("the allowed group is served", func(t *testing.T) {
		_, stderr, err := fetchSecretAs(m.Ctx, bin, "", target, nobody, envoyGID, nil)
		if err != nil && !strings.Contains(stderr, "no TLS certificate secret") {
			t.Fatalf("uid %d gid %d (allowGID) refused: %v %s", nobody, envoyGID, err, stderr)
		}
	})
}

// TestXDSIngressSecretAndNodeTable: the SDS secret is an ingress certificate of a key of its
// own, not agent.key, and the broker refuses that certificate while it takes agent.crt; made-up
// node IDs do not grow the server's node table beyond its bound, and free their places once
// their streams close.
func TestXDSIngressSecretAndNodeTable(t *testing.T) {
	m := harness.New(t)
	bin := nstest.Binary(t, m.Dir, "./tests/netns/cmd/xdsgrpc")
	sock := filepath.Join(m.Dir, "xds.sock")
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", fmt.Sprintf("ingress: {mode: envoy, xds: {listen: %q}}\n", sock))
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "", "")
	east.StartAgent("--cleanup-on-exit")
	west.StartAgent("--cleanup-on-exit")
	m.WaitConnected(90*time.Second, east, west)
	target := "unix://" + sock

	t.Run("the SDS secret is not agent.key and the broker refuses its certificate", func(t *testing.T) {
		var s *sdsSecret
		if err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			var stderr string
			var err error
			s, stderr, err = fetchSecretAs(m.Ctx, bin, "", target, 0, 0, nil)
			return err == nil, stderr
		}); err != nil {
			t.Fatalf("no SDS certificate secret served: %v", err)
		}
		agentKey, err := os.ReadFile(filepath.Join(east.StateDir, brokerclient.KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		agentCert, err := os.ReadFile(filepath.Join(east.StateDir, brokerclient.CertFile))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(s.Key) == strings.TrimSpace(string(agentKey)) {
			t.Fatal("the SDS secret's key is agent.key")
		}
		blk, _ := pem.Decode([]byte(s.Cert))
		if blk == nil {
			t.Fatalf("secret certificate is not PEM: %q", s.Cert)
		}
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		m.Logf("SDS certificate: %s, usages %v", leaf.Subject, leaf.ExtKeyUsage)
		if err := brokerCall(m, bin, east.GwNS, east.StateDir, east.Node, []byte(s.Cert), []byte(s.Key)); err == nil {
			t.Errorf("the broker accepted a call with the SDS secret's certificate (%s)", leaf.Subject)
		} else {
			m.Logf("broker refused the SDS certificate: %v", err)
		}
		// The same call with the agent's own certificate works: the refusal is the certificate's.
		if err := brokerCall(m, bin, east.GwNS, east.StateDir, east.Node, agentCert, agentKey); err != nil {
			t.Errorf("control call with agent.crt: %v", err)
		}
	})

	t.Run("made-up node IDs do not grow the node table", func(t *testing.T) {
		const tries = 300
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithCancel(m.Ctx)
		defer cancel()
		ads := discovery.NewAggregatedDiscoveryServiceClient(cc)
		var mu sync.Mutex
		answered, refused := 0, 0
		var wg sync.WaitGroup
		for i := range tries {
			wg.Go(func() {
				stream, err := ads.StreamAggregatedResources(ctx)
				if err == nil {
					err = stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprintf("fake-%04d-%s", i, strings.Repeat("x", 200))}, TypeUrl: resourcev3.ListenerType})
				}
				if err == nil {
					rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
					defer rcancel()
					done := make(chan error, 1)
					go func() { _, err := stream.Recv(); done <- err }()
					select {
					case err = <-done:
					case <-rctx.Done():
						err = rctx.Err()
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					answered++
				} else {
					refused++
				}
			})
		}
		wg.Wait()
		// The streams stay open (ctx) while the status is read.
		r := harness.Run(m.Ctx, m.Bin.Cablectl, "status", "--socket", east.StatusSocket, "-o", "json")
		if r.Err != nil {
			t.Fatal(r)
		}
		st, err := east.Status()
		if err != nil {
			t.Fatal(err)
		}
		fake := 0
		for _, n := range st.Ingress.XDS.Nodes {
			if strings.HasPrefix(n.Node, "fake-") {
				fake++
			}
		}
		m.Logf("%d streams with made-up node IDs: %d answered, %d refused; status lists %d of them, %d bytes", tries, answered, refused, fake, len(r.Stdout))
		if fake > 64 || answered > 64 {
			t.Errorf("the node table took %d made-up nodes (%d answered), want at most 64", fake, answered)
		}
		if refused < tries-64 {
			t.Errorf("%d streams refused, want at least %d", refused, tries-64)
		}
		if len(r.Stdout) > 256<<10 {
			t.Errorf("status is %d bytes with the made-up nodes", len(r.Stdout))
		}
		// Once their streams close, the made-up nodes make room: a real client gets in.
		cancel()
		if err := harness.WaitFor(20*time.Second, 250*time.Millisecond, func() (bool, string) {
			s, stderr, err := fetchSecretAs(m.Ctx, bin, "", target, 0, 0, nil)
			return err == nil && s != nil, stderr
		}); err != nil {
			t.Errorf("a client after the made-up nodes left: %v", err)
		}
	})
}
