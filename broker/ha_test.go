package broker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// replica is one broker of an HA pair, serving on loopback.
type replica struct {
	dir   string
	addr  string
	srv   *Server
	admin apiv1.AdminClient
	stop  func()
}

func startReplica(t *testing.T, etcd *etcdtest.Cluster, root, dir string) (*replica, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logw io.Writer = io.Discard
	if testing.Verbose() {
		logw = &tlog{t}
	}
	srv, err := New(t.Context(), Config{
		DataDir: dir, Listen: lis.Addr().String(), ReapInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Etcd:   &EtcdConfig{Endpoints: etcd.Endpoints(), Root: root, Advertise: lis.Addr().String()},
	})
	if err != nil {
		lis.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	var once sync.Once
	r := &replica{dir: dir, addr: lis.Addr().String(), srv: srv}
	r.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			srv.Close()
		})
	}
	t.Cleanup(r.stop)
	r.admin = apiv1.NewAdminClient(dialAdmin(t, dir, r.addr))
	return r, nil
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTwoReplicasServeOneMesh: two brokers on one etcd share the CA and secrets (sealed in
// etcd), hand out distinct cluster IDs under concurrent creation through both, each one's admin
// credential lists both, an agent watching one replica sees a change made through the other,
// and both give a pair the same PSK.
func TestTwoReplicasServeOneMesh(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	root := "/cablemesh-ha-test/"
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := startReplica(t, etcd, root, dirA)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a second replica without the secret key refuses to start", func(t *testing.T) {
		_, err := startReplica(t, etcd, root, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "secret key file is missing") || !strings.Contains(err.Error(), "copy it") {
			t.Fatalf("start without the key: %v", err)
		}
	})
	copyFile(t, filepath.Join(dirA, SecretKeyFile), filepath.Join(dirB, SecretKeyFile))
	b, err := startReplica(t, etcd, root, dirB)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("both replicas hold the one CA, and etcd holds no secret in the clear", func(t *testing.T) {
		if a.srv.CAHash() != b.srv.CAHash() {
			t.Fatalf("CA %s vs %s", a.srv.CAHash(), b.srv.CAHash())
		}
		for _, f := range sharedSecretFiles {
			fa, _ := os.ReadFile(filepath.Join(dirA, f))
			fb, _ := os.ReadFile(filepath.Join(dirB, f))
			if len(fa) == 0 || string(fa) != string(fb) {
				t.Errorf("%s differs between the replicas", f)
			}
		}
		key, _ := os.ReadFile(filepath.Join(dirA, pki.CAKeyFile))
		cli := etcd.Client(t)
		resp, err := cli.Get(context.Background(), root, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if strings.Contains(string(kv.Value), "PRIVATE KEY") || strings.Contains(string(kv.Value), string(key)) {
				t.Fatalf("etcd key %s holds key material in the clear", kv.Key)
			}
		}
	})

	t.Run("each admin.yaml lists both replicas and works when the first is down", func(t *testing.T) {
		for _, r := range []*replica{a, b} {
			var cfg *adminconfig.Config
			err := waitUntil(10*time.Second, func() bool {
				var err error
				cfg, err = adminconfig.Load(filepath.Join(r.dir, AdminConfigFile))
				return err == nil && strings.Count(cfg.Broker, ",") == 1
			})
			if err != nil {
				t.Fatalf("admin.yaml of %s: broker %q", r.addr, cfg.Broker)
			}
			if !strings.HasPrefix(cfg.Broker, r.addr+",") || !strings.Contains(cfg.Broker, a.addr) || !strings.Contains(cfg.Broker, b.addr) {
				t.Fatalf("admin.yaml of %s lists %q, want itself first, then the other", r.addr, cfg.Broker)
			}
		}
		addrs, err := a.srv.ha.ReplicaAddrs(ctxT(t))
		if err != nil || len(addrs) != 2 {
			t.Fatalf("ReplicaAddrs: %v %v; want both replicas", addrs, err)
		}
		// A dead address first: the credential still works, through the next one.
		dead, _ := net.Listen("tcp", "127.0.0.1:0")
		deadAddr := dead.Addr().String()
		dead.Close()
		cfg, err := adminconfig.Load(filepath.Join(dirA, AdminConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Broker = deadAddr + "," + b.addr
		conn, err := adminconfig.Dial(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := apiv1.NewAdminClient(conn).ListClusters(ctxT(t), &apiv1.ListClustersRequest{}); err != nil {
			t.Fatalf("list through %s: %v", cfg.Broker, err)
		}
	})

	t.Run("clusters created concurrently through both replicas get distinct IDs", func(t *testing.T) {
		const each = 20
		var (
			mu  sync.Mutex
			ids = map[uint32]string{}
			wg  sync.WaitGroup
		)
		for ri, r := range []*replica{a, b} {
			for i := range each {
				wg.Go(func() {
					name := fmt.Sprintf("c%d-%02d", ri, i)
					resp, err := r.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{
						Cluster: name, PodCidrs: []string{fmt.Sprintf("10.%d.%d.0/24", 100+ri, i)}})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("create %s through %s: %v", name, r.addr, err)
						return
					}
					if other, dup := ids[resp.Cluster.Id]; dup {
						t.Errorf("ID %d handed to %s and %s", resp.Cluster.Id, other, name)
					}
					ids[resp.Cluster.Id] = name
				})
			}
		}
		wg.Wait()
		for _, r := range []*replica{a, b} {
			l, err := r.admin.ListClusters(ctxT(t), &apiv1.ListClustersRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Clusters) != 2*each {
				t.Fatalf("%s lists %d clusters, want %d", r.addr, len(l.Clusters), 2*each)
			}
			for _, c := range l.Clusters {
				if ids[c.Id] != c.Name {
					t.Fatalf("%s: cluster %s has ID %d, acknowledged to %q", r.addr, c.Name, c.Id, ids[c.Id])
				}
			}
		}
	})

	t.Run("an agent watching one replica sees a change made through the other, with the same PSKs", func(t *testing.T) {
		tok, err := a.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}})
		if err != nil {
			t.Fatal(err)
		}
		ag := mustJoin(t, b.addr, tok.Token, "east", "gw1")
		w, err := ag.client(t, b.addr).Watch(ctxT(t), &apiv1.WatchRequest{})
		if err != nil {
			t.Fatal(err)
		}
		first := recv(t, w)
		if !first.Snapshot {
			t.Fatalf("first message is not a snapshot")
		}
		if _, err := a.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.0/16"}}); err != nil {
			t.Fatal(err)
		}
		var westPSK []byte
		for westPSK == nil {
			m := recv(t, w)
			for _, ev := range m.Events {
				if c := ev.GetResource().GetCluster(); c != nil && c.Name == "west" {
					westPSK = c.PairPsk
				}
			}
		}
		// The same agent through replica a gets the same key for the pair.
		w2, err := ag.client(t, a.addr).Watch(ctxT(t), &apiv1.WatchRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range recv(t, w2).Events {
			if c := ev.GetResource().GetCluster(); c != nil && c.Name == "west" && string(c.PairPsk) != string(westPSK) {
				t.Fatalf("the east-west PSK differs between the replicas")
			}
		}
	})

	t.Run("a replica restarted with its data dir rejoins with the same CA", func(t *testing.T) {
		hash := b.srv.CAHash()
		b.stop()
		b2, err := startReplica(t, etcd, root, dirB)
		if err != nil {
			t.Fatal(err)
		}
		if b2.srv.CAHash() != hash {
			t.Fatalf("CA changed across a restart")
		}
	})
}

// TestAReplicaTakesTheMeshCAOverAnotherInItsDataDir: a data dir that belonged to another mesh
// (its own CA) joining an HA mesh gets the mesh's CA, keeps its old files as *.replaced, and its
// certificates are reissued by the mesh's CA.
func TestAReplicaTakesTheMeshCAOverAnotherInItsDataDir(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	root := "/cablemesh-ha-test/"
	dirA := t.TempDir()
	a, err := startReplica(t, etcd, root, dirA)
	if err != nil {
		t.Fatal(err)
	}
	dirB := t.TempDir()
	if _, _, err := pki.LoadOrCreate(dirB, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(dirA, SecretKeyFile), filepath.Join(dirB, SecretKeyFile))
	b, err := startReplica(t, etcd, root, dirB)
	if err != nil {
		t.Fatal(err)
	}
	if a.srv.CAHash() != b.srv.CAHash() {
		t.Fatal("the replica kept its own CA")
	}
	if _, err := os.Stat(filepath.Join(dirB, pki.CAKeyFile+".replaced")); err != nil {
		t.Fatalf("old CA key not kept: %v", err)
	}
	if _, err := b.admin.ListClusters(ctxT(t), &apiv1.ListClustersRequest{}); err != nil {
		t.Fatalf("admin of the replica: %v", err)
	}
}

// TestAnEmbeddedBrokerMovesToEtcdWithItsCA: the first replica adopts the CA and secrets already
// in its data dir, so agents that joined the embedded broker keep trusting it.
func TestAnEmbeddedBrokerMovesToEtcdWithItsCA(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	dir := t.TempDir()
	p, _, err := pki.LoadOrCreate(dir, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secret, _, err := loadOrCreateMeshSecret(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := startReplica(t, etcd, "/cablemesh-ha-test/", dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.srv.CAHash() != p.CAHash() || string(r.srv.meshSecret) != string(secret) {
		t.Fatal("the first replica did not adopt the data dir's CA and mesh secret")
	}
	sec, err := store.NewEtcdSecrets(etcd.Client(t), "/cablemesh-ha-test/", mustRead(t, filepath.Join(dir, SecretKeyFile)))
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := sec.Load(context.Background())
	if err != nil || !ok || string(m[MeshSecretFile]) != string(secret) {
		t.Fatalf("etcd's secrets: ok=%v err=%v", ok, err)
	}
}

func TestParseEtcdFlags(t *testing.T) {
	tests := []struct {
		name, endpoints, root, advertise, cert, key, wantErr string
	}{
		{"two http endpoints", "http://10.0.0.1:2379,http://10.0.0.2:2379", "/cablemesh/", "", "", "", ""},
		{"an endpoint without a scheme", "10.0.0.1:2379", "/cablemesh/", "", "", "", "is not http(s)://host:port"},
		{"an endpoint without a port", "http://10.0.0.1", "/cablemesh/", "", "", "", "is not http(s)://host:port"},
		{"a prefix without its slashes", "http://a:2379", "cablemesh", "", "", "", "must start and end with /"},
		{"an advertise address without a port", "http://a:2379", "/c/", "10.0.0.1", "", "", "--advertise-address"},
		{"a client certificate without its key", "https://a:2379", "/c/", "", "c.pem", "", "go together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseEtcdFlags(tt.endpoints, tt.root, "", tt.advertise, "", tt.cert, tt.key)
			if tt.wantErr == "" {
				if err != nil || len(cfg.Endpoints) != strings.Count(tt.endpoints, ",")+1 {
					t.Fatalf("%v %v", cfg, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitUntil(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
