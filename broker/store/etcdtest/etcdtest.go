// Package etcdtest starts etcd for tests: one or more members of one cluster, as real etcd
// processes on loopback ports, with their data in a temp dir (on tmpfs when /dev/shm exists, so
// that fsync costs nothing), stopped and removed when the test ends. Tests that use it skip with a
// message when no etcd binary is installed (Debian: apt-get install etcd-server).
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BinaryEnv names an etcd binary to use instead of the one on PATH.
const BinaryEnv = "CABLEMESH_ETCD"

// Binary returns the etcd binary, or ok false when there is none.
func Binary() (path string, ok bool) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, true
	}
	p, err := exec.LookPath("etcd")
	return p, err == nil
}

// Require skips t unless an etcd binary is installed.
func Require(t testing.TB) string {
	t.Helper()
	p, ok := Binary()
	if !ok {
		t.Skipf("skipping: no etcd binary on PATH (Debian: apt-get install etcd-server; or set %s)", BinaryEnv)
	}
	return p
}

// MemberArgs are the flags of member name of a cluster whose members' peer URLs initial lists
// ("m0=http://127.0.0.1:2380,..."). The store needs large transactions (an apply of many
// policies is one commit with two writes per policy), hence --max-txn-ops and
// --max-request-bytes well above etcd's defaults.
func MemberArgs(name, dataDir, clientURL, peerURL, initial string) []string {
	return []string{
		"--name", name,
		"--data-dir", dataDir,
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", initial,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "cablemesh-test",
		"--max-txn-ops", "10000",
		"--max-request-bytes", "16777216",
		"--logger", "zap",
		"--log-level", "warn",
	}
}

// Member is one etcd process.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	DataDir   string
	args      []string
	bin       string
	logPath   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Cluster is the members of one etcd cluster.
type Cluster struct {
	Members []*Member
	dir     string
}

// Endpoints are the client URLs of every member.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// Start starts an etcd cluster of n members (skipping t when etcd is not installed) and waits
// until it serves; everything is stopped and removed when t ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartWith(t, n)
}

// DefaultLimits are the flags that give a member etcd's own limits of one transaction instead of
// MemberArgs' raised ones: what an operator's etcd has unless told otherwise.
var DefaultLimits = []string{"--max-txn-ops", "128", "--max-request-bytes", "1572864"}

// StartWith is Start with extra flags for every member, after MemberArgs' (so they override
// them: etcd takes the last value of a repeated flag).
func StartWith(t testing.TB, n int, extra ...string) *Cluster {
	t.Helper()
	bin := Require(t)
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "cablemesh-etcd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dir: dir}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, m := range c.Members {
				b, _ := os.ReadFile(m.logPath)
				t.Logf("---- etcd %s log (tail):\n%s", m.Name, tailLines(string(b), 30))
			}
		}
		os.RemoveAll(dir)
	})
	ports := freePorts(t, 2*n)
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			DataDir:   filepath.Join(dir, fmt.Sprintf("m%d", i)),
			bin:       bin,
			logPath:   filepath.Join(dir, fmt.Sprintf("m%d.log", i)),
		}
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.args = append(MemberArgs(m.Name, m.DataDir, m.ClientURL, m.PeerURL, strings.Join(initial, ",")), extra...)
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, err := cli.Put(ctx, "/cablemesh-etcdtest-ready", "1")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("etcd did not start serving within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

// Client is a client of every member, closed when t ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Start starts (or restarts, with the same data) the member's process.
func (m *Member) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(m.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start etcd %s: %w", m.Name, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	m.cmd, m.done = cmd, done
	return nil
}

// Kill SIGKILLs the member and waits for it to end.
func (m *Member) Kill() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Stop stops every member.
func (c *Cluster) Stop() {
	for _, m := range c.Members {
		m.Kill()
	}
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
