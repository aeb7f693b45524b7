package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// High availability: several cable-broker replicas share one etcd cluster.
//
//   - The store (every resource, the revision and the event log) is store.Etcd under
//     <root>store/: allocation is transactional across replicas, and every replica's watchers
//     see every replica's commits (see store.Etcd).
//   - The shared secrets (the mesh CA certificate and key, the join-token signing key, the mesh
//     secret the pair PSKs derive from: sharedSecretFiles) are one key, <root>secrets, sealed
//     with AES-256-GCM under the replica's secret key file (store.EtcdSecrets). The first
//     replica creates them (or adopts those already in its data dir, e.g. when an embedded
//     broker moves to etcd) and the key file; every other replica needs a copy of that key
//     file (0600) and refuses to start without it rather than create another. Each replica
//     writes the secrets into its data dir (0600), where pki and the mesh secret are loaded
//     from as for the embedded store: anyone who can read the data dir can read the key that
//     opens etcd's copy anyway.
//   - Each replica keeps its own serving certificate and admin certificate (issued by the shared
//     CA, so they work against every replica) and registers its address under
//     <root>brokers/<host:port>; its admin.yaml lists every registered replica, its own first, and
//     is rewritten when one registers. cablectl tries them in turn.
//   - Nothing needs a leader: the lease reaper runs on every replica and is idempotent (its
//     list-then-delete is one transaction; when two replicas reap the same endpoint, one
//     commits and the other's retry finds nothing left to do), and start-up work (the default
//     policy, VIP reconciliation, lease extension) is transactional the same way.

// EtcdConfig makes the broker keep its state in etcd (Config.Etcd).
type EtcdConfig struct {
	// Endpoints are the etcd client URLs (http://host:2379 or https://...).
	Endpoints []string
	// Root is the key prefix of the mesh in etcd; default "/cablemesh/". Two meshes may share an
	// etcd cluster under two roots.
	Root string
	// SecretKeyFile seals the secrets kept in etcd; default DataDir/secret.key. Every replica
	// needs the same file.
	SecretKeyFile string
	// Advertise is host:port at which other replicas' admin.yaml reach this one; default the
	// listen address when its host is a specific IP.
	Advertise string
	// TLS, when set, is the client TLS configuration for etcd.
	TLS *tls.Config
	// DialTimeout bounds connecting to etcd at start (default 10s); StartTimeout bounds the
	// whole start-up against etcd (default 60s).
	DialTimeout  time.Duration
	StartTimeout time.Duration
	// Store tunes the etcd store (compaction, attempt timeout).
	Store store.EtcdOptions
}

// DefaultEtcdRoot is EtcdConfig.Root's default.
const DefaultEtcdRoot = "/cablemesh/"

// SecretKeyFile is the default name of the key that seals the secrets in etcd.
const SecretKeyFile = "secret.key"

// sharedSecretFiles are the data dir files every replica must hold the same copy of.
var sharedSecretFiles = []string{pki.CACertFile, pki.CAKeyFile, pki.TokenKeyFile, MeshSecretFile}

// perCAFiles are issued by the CA; a replica that receives another CA drops them to be reissued.
var perCAFiles = []string{pki.ServerCertFile, pki.ServerKeyFile, pki.AdminCertFile, pki.AdminKeyFile, AdminConfigFile}

// haReplica is a broker's link to etcd.
type haReplica struct {
	cfg  EtcdConfig
	cli  *clientv3.Client
	log  *slog.Logger
	dir  string
	root string
}

// openHA connects to etcd, brings the shared secrets into the data dir (creating them on the
// first replica) and opens the store. serverIPs and now are pki.LoadOrCreate's.
func openHA(ctx context.Context, cfg EtcdConfig, dataDir string, log *slog.Logger, storeOpts store.Options, serverIPs []net.IP, now time.Time) (_ *haReplica, _ *store.Etcd, err error) {
	if len(cfg.Endpoints) == 0 {
		return nil, nil, errors.New("etcd: no endpoints")
	}
	if cfg.Root == "" {
		cfg.Root = DefaultEtcdRoot
	}
	if !strings.HasPrefix(cfg.Root, "/") || !strings.HasSuffix(cfg.Root, "/") {
		return nil, nil, fmt.Errorf("etcd root %q must start and end with /", cfg.Root)
	}
	if cfg.SecretKeyFile == "" {
		cfg.SecretKeyFile = filepath.Join(dataDir, SecretKeyFile)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.Store.Logger == nil {
		cfg.Store.Logger = log
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  cfg.TLS,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("etcd client for %v: %w", cfg.Endpoints, err)
	}
	h := &haReplica{cfg: cfg, cli: cli, log: log, dir: dataDir, root: cfg.Root}
	defer func() {
		if err != nil {
			cli.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	if err := h.syncSecrets(ctx, serverIPs, now); err != nil {
		return nil, nil, err
	}
	st, err := store.OpenEtcd(ctx, cli, cfg.Root, storeOpts, cfg.Store)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
	}
	log.Info("store in etcd", "endpoints", strings.Join(cfg.Endpoints, ","), "root", cfg.Root)
	return h, st, nil
}

func (h *haReplica) close() error { return h.cli.Close() }

// syncSecrets makes the data dir hold the mesh's shared secrets as etcd has them. On the first
// replica (etcd has none) it creates them here, as a lone broker would, or adopts what the data
// dir holds, and stores them sealed; a replica that loses that race takes the winner's.
func (h *haReplica) syncSecrets(ctx context.Context, serverIPs []net.IP, now time.Time) error {
	has, err := store.EtcdHasSecrets(ctx, h.cli, h.root)
	if err != nil {
		return fmt.Errorf("etcd %v: %w", h.cfg.Endpoints, err)
	}
	key, created, err := store.LoadOrCreateSecretKey(h.cfg.SecretKeyFile, !has)
	if err != nil {
		return err
	}
	if created {
		h.log.Info("created the secret key that seals the mesh's secrets in etcd; copy it (mode 0600) to every other replica before starting it",
			"path", h.cfg.SecretKeyFile, "keyID", store.SecretKeyID(key))
	}
	sec, err := store.NewEtcdSecrets(h.cli, h.root, key)
	if err != nil {
		return err
	}
	shared, ok, err := sec.Load(ctx)
	if err != nil {
		return err
	}
	if !ok {
		p, createdCA, err := pki.LoadOrCreate(h.dir, serverIPs, now)
		if err != nil {
			return err
		}
		if _, _, err := loadOrCreateMeshSecret(h.dir); err != nil {
			return err
		}
		local := map[string][]byte{}
		for _, f := range sharedSecretFiles {
			b, err := os.ReadFile(filepath.Join(h.dir, f))
			if err != nil {
				return fmt.Errorf("read %s to store it in etcd: %w", f, err)
			}
			local[f] = b
		}
		var stored bool
		if shared, stored, err = sec.Create(ctx, local); err != nil {
			return err
		}
		if stored {
			what := "adopted the mesh CA and secrets of"
			if createdCA {
				what = "created the mesh CA and secrets in"
			}
			h.log.Info(what+" the data dir and stored them in etcd, sealed", "dir", h.dir, "ca", p.CAHash(), "keyID", store.SecretKeyID(key))
			return nil
		}
	}
	return h.installSecrets(shared)
}

// installSecrets writes the shared secrets into the data dir where they differ. A CA that
// replaces another one (this data dir belonged to another mesh, or lost the first-start race)
// takes what that CA issued with it; the files replaced are kept as NAME.replaced.
func (h *haReplica) installSecrets(shared map[string][]byte) error {
	for _, f := range sharedSecretFiles {
		if _, ok := shared[f]; !ok {
			return fmt.Errorf("the secrets in etcd lack %s", f)
		}
	}
	caChanged := false
	for _, f := range sharedSecretFiles {
		path := filepath.Join(h.dir, f)
		cur, err := os.ReadFile(path)
		if err == nil && bytes.Equal(cur, shared[f]) {
			continue
		}
		if err == nil {
			if f == pki.CACertFile {
				caChanged = true
			}
			if err := os.Rename(path, path+".replaced"); err != nil {
				return err
			}
			h.log.Warn("the data dir held another copy of a shared secret; replaced by the mesh's from etcd", "file", f, "keptAs", f+".replaced")
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if err := pki.WriteFile(path, shared[f]); err != nil {
			return err
		}
	}
	if caChanged {
		for _, f := range perCAFiles {
			if err := os.Remove(filepath.Join(h.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// advertise is the address other replicas' admin.yaml give for this one, "" when it has none
// usable from elsewhere (an unspecified or loopback listen address and no Advertise).
func (h *haReplica) advertise(lis net.Addr) string {
	if h.cfg.Advertise != "" {
		return h.cfg.Advertise
	}
	host, _, err := net.SplitHostPort(lis.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() || ip.IsLoopback() {
		return ""
	}
	return lis.String()
}

func (h *haReplica) brokersPrefix() string { return h.root + "brokers/" }

// serveAdminConfig registers this replica's address in etcd and keeps DIR/admin.yaml listing
// every registered replica, this one first (self: its own dialable address), until ctx ends.
func (h *haReplica) serveAdminConfig(ctx context.Context, s *Server, self, advertise string, wg *sync.WaitGroup) error {
	if advertise != "" {
		if _, err := h.cli.Put(ctx, h.brokersPrefix()+advertise, advertise); err != nil {
			return fmt.Errorf("register this broker in etcd: %w", err)
		}
	} else {
		s.log.Warn("this replica's address is not registered for other replicas' admin.yaml: listen on a specific address or set --advertise-address", "listen", self)
	}
	resp, err := h.cli.Get(ctx, h.brokersPrefix(), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list the brokers in etcd: %w", err)
	}
	addrs := func(kvs [][]byte) []string {
		out := []string{self}
		var others []string
		for _, v := range kvs {
			if a := string(v); a != self && a != advertise {
				others = append(others, a)
			}
		}
		slices.Sort(others)
		return append(out, others...)
	}
	var vals [][]byte
	for _, kv := range resp.Kvs {
		vals = append(vals, kv.Value)
	}
	if err := s.writeAdminConfigList(addrs(vals)); err != nil {
		return err
	}
	wg.Go(func() {
		rev := resp.Header.Revision
		for ctx.Err() == nil {
			wch := h.cli.Watch(ctx, h.brokersPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
			for wr := range wch {
				if wr.Err() != nil {
					break
				}
				rev = wr.Header.Revision
				r, err := h.cli.Get(ctx, h.brokersPrefix(), clientv3.WithPrefix())
				if err != nil {
					continue
				}
				vals = vals[:0]
				for _, kv := range r.Kvs {
					vals = append(vals, kv.Value)
				}
				if err := s.writeAdminConfigList(addrs(vals)); err != nil {
					s.log.Error("rewrite admin.yaml with the broker list", "err", err)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	return nil
}

// writeAdminConfigList writes DIR/admin.yaml naming the brokers at addrs (tried in turn by
// cablectl), unless it says that already.
func (s *Server) writeAdminConfigList(addrs []string) error {
	c := &adminconfig.Config{
		Broker:      strings.Join(addrs, ","),
		CA:          string(s.pki.CAPEM),
		Certificate: string(s.pki.AdminCert),
		Key:         string(s.pki.AdminKey),
	}
	b, err := c.Marshal()
	if err != nil {
		return fmt.Errorf("encode admin config: %w", err)
	}
	path := s.AdminConfigPath()
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, b) {
		return nil
	}
	if err := pki.WriteFile(path, b); err != nil {
		return err
	}
	s.log.Info("wrote admin credential", "path", path, "broker", c.Broker)
	return nil
}

// adminAddress is the address of lis that this host's cablectl dials: an unspecified host
// becomes 127.0.0.1.
func adminAddress(lis net.Addr) (string, error) {
	host, port, err := net.SplitHostPort(lis.String())
	if err != nil {
		return "", fmt.Errorf("admin config: listener address %q: %v", lis, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// ParseEtcdFlags checks cable-broker's etcd flags and makes the EtcdConfig they describe:
// endpoints are comma-separated http(s)://host:port URLs; the TLS files are read now.
func ParseEtcdFlags(endpoints, root, secretKeyFile, advertise, caFile, certFile, keyFile string) (*EtcdConfig, error) {
	cfg := &EtcdConfig{Root: root, SecretKeyFile: secretKeyFile, Advertise: advertise}
	for _, e := range strings.Split(endpoints, ",") {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("--etcd-endpoints: %q is not http(s)://host:port", e)
		}
		cfg.Endpoints = append(cfg.Endpoints, e)
	}
	if root == "" || !strings.HasPrefix(root, "/") || !strings.HasSuffix(root, "/") {
		return nil, fmt.Errorf("--etcd-prefix %q: must start and end with /", root)
	}
	if advertise != "" {
		if host, port, err := net.SplitHostPort(advertise); err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("--advertise-address %q is not host:port", advertise)
		}
	}
	if caFile == "" && certFile == "" && keyFile == "" {
		return cfg, nil
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cacert: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--etcd-cacert %s holds no PEM certificate", caFile)
		}
	}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	cfg.TLS = tc
	return cfg, nil
}

// ReplicaAddrs are the IP addresses of every registered replica (<root>brokers/), for checks
// that must protect every broker's address, not only this one's (a pod CIDR covering any
// replica cuts agents off from it). Replicas registered by host name are left out.
func (h *haReplica) ReplicaAddrs(ctx context.Context) ([]netip.Addr, error) {
	resp, err := h.cli.Get(ctx, h.brokersPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list the brokers in etcd: %w", err)
	}
	var out []netip.Addr
	for _, kv := range resp.Kvs {
		host, _, err := net.SplitHostPort(string(kv.Value))
		if err != nil {
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out, nil
}
