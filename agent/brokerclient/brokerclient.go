// Package brokerclient gives the agent its identity at the broker and its connection to it: the
// first join (a join token exchanged for a client certificate, the broker verified by the CA
// fingerprint pinned in the token), the files that persist that identity in the state dir, and
// the mTLS gRPC connection used afterwards. The broker address may list several replicas of an HA
// broker (host:port,host:port...): the agent's calls then go to the replicas that answer, in turn,
// and leave one that goes away.
package brokerclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Files of the agent's identity inside its state dir.
const (
	KeyFile  = "agent.key"
	CertFile = "agent.crt"
	CAFile   = "ca.crt"
)

// ErrNoIdentity means the state dir holds no agent certificate: the agent must join first.
var ErrNoIdentity = errors.New("state dir holds no agent certificate")

// Identity is the agent's client certificate and the mesh CAs it trusts (CAPEM: the bundle they
// come from).
type Identity struct {
	Cert  tls.Certificate
	Leaf  *x509.Certificate
	CAs   *x509.CertPool
	CAPEM []byte
}

// LoadIdentity reads agent.key, agent.crt and ca.crt from stateDir. If agent.crt is absent it
// returns ErrNoIdentity (Join writes agent.crt last, so its presence means a complete set). A
// renewal a crash interrupted is completed first (see Renew).
func LoadIdentity(stateDir string) (*Identity, error) {
	certPath := filepath.Join(stateDir, CertFile)
	if _, err := os.Stat(stateDir); err == nil {
		if err := completePending(stateDir); err != nil {
			return nil, fmt.Errorf("complete an interrupted certificate renewal in %s: %w", stateDir, err)
		}
	}
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoIdentity
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", certPath, err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(stateDir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("read agent key: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(stateDir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("read mesh CA: %w", err)
	}
	return identityFromPEM(certPEM, keyPEM, caPEM)
}

func identityFromPEM(certPEM, keyPEM, caPEM []byte) (*Identity, error) {
	cert, leaf, err := ParsePair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("agent certificate and key: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("mesh CA file holds no PEM certificate")
	}
	return &Identity{Cert: cert, Leaf: leaf, CAs: pool, CAPEM: caPEM}, nil
}

// RefusedError is the broker refusing a join (bad, expired, forged or other-cluster token, or a
// bad request). Retrying with the same token cannot succeed. Msg is the broker's words, verbatim.
type RefusedError struct {
	Code codes.Code
	Msg  string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("broker refused to join: %s (%s)", e.Msg, e.Code)
}

// PinError means the broker did not prove it holds the CA the join token pins: it is not the
// broker that issued the token (or a man in the middle). Permanent.
type PinError struct{ Err error }

func (e *PinError) Error() string {
	return "broker is not the one the join token was issued by: " + e.Err.Error()
}
func (e *PinError) Unwrap() error { return e.Err }

// Permanent reports whether err from Join cannot be fixed by retrying.
func Permanent(err error) bool {
	var re *RefusedError
	var pe *PinError
	var te *TokenError
	return errors.As(err, &re) || errors.As(err, &pe) || errors.As(err, &te)
}

// TokenError is a join token the agent cannot use at all (unreadable, malformed, for another
// cluster). Permanent.
type TokenError struct{ Msg string }

func (e *TokenError) Error() string { return e.Msg }

// JoinParams say who joins where with which token.
type JoinParams struct {
	Broker    string
	Cluster   string
	Node      string
	TokenFile string
	StateDir  string
	// Timeout bounds the one Join call; 0 means 15s.
	Timeout time.Duration
}

// Join exchanges the join token for a client certificate and persists agent.key (0600),
// agent.crt and ca.crt in StateDir. Nothing is written unless the broker accepted the join and
// its answer checks out. It returns the new identity and the cluster record from the broker.
func Join(ctx context.Context, p JoinParams) (*Identity, *apiv1.Cluster, error) {
	if p.TokenFile == "" {
		return nil, nil, &TokenError{Msg: "joinTokenFile is not set and the state dir holds no agent certificate: nothing to join with"}
	}
	raw, err := os.ReadFile(p.TokenFile)
	if err != nil {
		return nil, nil, &TokenError{Msg: fmt.Sprintf("joinTokenFile: %v", err)}
	}
	token := strings.TrimSpace(string(raw))
	claims, err := jointoken.Decode(token)
	if err != nil {
		return nil, nil, &TokenError{Msg: fmt.Sprintf("joinTokenFile %s: %v", p.TokenFile, err)}
	}
	if claims.Cluster != p.Cluster {
		return nil, nil, &TokenError{Msg: fmt.Sprintf("joinTokenFile %s: token is for cluster %q, config says cluster %q", p.TokenFile, claims.Cluster, p.Cluster)}
	}

	kr, err := NewKeyRequest(pkix.Name{CommonName: p.Node, Organization: []string{p.Cluster}}, "agent")
	if err != nil {
		return nil, nil, err
	}

	pin := &pinVerifier{caHash: claims.CAHash}
	target, topts, err := dialTarget(p.Broker)
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient(target, append(topts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is verified by pin.verify against the token's CA hash instead of a trust
		// store the agent does not have yet.
		InsecureSkipVerify: true,
		VerifyConnection:   pin.verify,
	})))...)
	if err != nil {
		return nil, nil, fmt.Errorf("dial broker %s: %w", p.Broker, err)
	}
	defer conn.Close()

	timeout := p.Timeout
	if timeout == 0 {
		timeout = 15 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := apiv1.NewAgentClient(conn).Join(cctx, &apiv1.JoinRequest{
		Token:   token,
		Cluster: p.Cluster,
		Node:    p.Node,
		CsrPem:  kr.CSRPEM,
	}, grpc.WaitForReady(false))
	if err != nil {
		if perr := pin.failure(); perr != nil {
			return nil, nil, &PinError{Err: perr}
		}
		st, _ := status.FromError(err)
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.ResourceExhausted:
			return nil, nil, fmt.Errorf("join broker %s: %w", p.Broker, err)
		}
		return nil, nil, &RefusedError{Code: st.Code(), Msg: st.Message()}
	}

	caPEM := resp.GetCaPem()
	caBlock, _ := pem.Decode(caPEM)
	if caBlock == nil {
		return nil, nil, errors.New("join answer: ca_pem holds no PEM certificate")
	}
	if got := jointoken.CAHash(caBlock.Bytes); got != claims.CAHash {
		return nil, nil, &PinError{Err: fmt.Errorf("join answer carries CA %s, token pins %s", got, claims.CAHash)}
	}
	keyPEM := kr.KeyPEM
	id, err := identityFromPEM(resp.GetCertificatePem(), keyPEM, caPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("join answer: %w", err)
	}
	if _, err := id.Leaf.Verify(x509.VerifyOptions{Roots: id.CAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, nil, fmt.Errorf("join answer: certificate is not a client certificate of the mesh CA: %w", err)
	}

	if err := os.MkdirAll(p.StateDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create state dir: %w", err)
	}
	// agent.crt goes last: LoadIdentity treats its presence as "identity complete".
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{{CAFile, caPEM, 0o644}, {KeyFile, keyPEM, 0o600}, {CertFile, resp.GetCertificatePem(), 0o644}} {
		if err := brokerstate.WriteFileAtomic(filepath.Join(p.StateDir, f.name), f.data, f.perm); err != nil {
			return nil, nil, err
		}
	}
	return id, resp.GetCluster(), nil
}

// pinVerifier checks the broker's presented chain against the CA hash from the join token and
// remembers why it failed, so Join can tell a wrong broker from a network error.
type pinVerifier struct {
	caHash string
	mu     sync.Mutex
	err    error
}

func (v *pinVerifier) verify(cs tls.ConnectionState) error {
	err := VerifyPinned(cs.PeerCertificates, v.caHash)
	v.mu.Lock()
	v.err = err
	v.mu.Unlock()
	return err
}

func (v *pinVerifier) failure() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}

// VerifyPinned checks that chain (leaf first) holds a CA certificate whose jointoken.CAHash is
// caHash and that the leaf is valid for apiv1.BrokerServerName under that CA.
func VerifyPinned(chain []*x509.Certificate, caHash string) error {
	if len(chain) == 0 {
		return errors.New("broker presented no certificate")
	}
	var ca *x509.Certificate
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		if jointoken.CAHash(c.Raw) == caHash {
			ca = c
		} else {
			inter.AddCert(c)
		}
	}
	if ca == nil {
		return fmt.Errorf("no certificate in the broker's chain has the pinned hash %s", caHash)
	}
	if !ca.IsCA {
		return fmt.Errorf("certificate with the pinned hash %s is not a CA", caHash)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: apiv1.BrokerServerName}); err != nil {
		return fmt.Errorf("broker certificate is not valid under the pinned CA: %w", err)
	}
	return nil
}

// TLSConfig is the mTLS client configuration for every call after Join.
func (id *Identity) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{id.Cert},
		RootCAs:      id.CAs,
		ServerName:   apiv1.BrokerServerName,
	}
}

// Dial opens the mTLS connection to the broker. gRPC reconnects it by itself; it does not block.
// Its reconnect backoff is capped at 15s like the agent's own (gRPC's default grows to 120s,
// which would leave an agent blind for two minutes after a long broker outage). A connection
// attempt may take 20 s (gRPC's default): a broker that a whole fleet dials at once handshakes
// them in the order they came (broker/handshakes.go), and an agent that gave up after 5 s (as
// it did) threw its place away and dialed again behind everyone, with the broker's work on its
// first handshake lost. broker may list several replicas (see SplitAddresses); a replica that
// does not answer costs no call meanwhile, round_robin uses the others.
func Dial(broker string, id *Identity, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial(broker, id.TLSConfig(), opts)
}

func dial(broker string, tlsConf *tls.Config, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	target, topts, err := dialTarget(broker)
	if err != nil {
		return nil, err
	}
	all := append(topts, []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 15 * time.Second},
			MinConnectTimeout: 20 * time.Second,
		}),
	}...)
	all = append(all, opts...)
	conn, err := grpc.NewClient(target, all...)
	if err != nil {
		return nil, fmt.Errorf("dial broker %s: %w", broker, err)
	}
	return conn, nil
}

// SplitAddresses parses a broker address: host:port, or the replicas of an HA broker as
// host:port,host:port,... (spaces around an entry are ignored; no duplicates). Every port is
// 1..65535.
func SplitAddresses(broker string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(broker, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return nil, fmt.Errorf("%q is not host:port", a)
		}
		var n int
		if _, err := fmt.Sscanf(port, "%d", &n); err != nil || n < 1 || n > 65535 || fmt.Sprint(n) != port {
			return nil, fmt.Errorf("%q has no valid port (1..65535)", a)
		}
		for _, o := range out {
			if o == a {
				return nil, fmt.Errorf("%q is listed twice", a)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// dialTarget is the gRPC target for broker, with the options it needs. One address is dialed as
// before (resolved by DNS). Several are the replicas of one broker: a static resolver hands them
// to round_robin, which keeps a connection to each replica that answers and sends each call to
// the next ready one. A replica that goes away drops out at once; one that is up but failing
// (cut off from etcd) fails a call, and the agent's retry goes to another; the calls of a fleet
// spread over the replicas. Every replica serves every revision, so a watch resumes on any.
func dialTarget(broker string) (string, []grpc.DialOption, error) {
	addrs, err := SplitAddresses(broker)
	if err != nil {
		return "", nil, fmt.Errorf("broker address: %w", err)
	}
	if len(addrs) == 1 {
		return addrs[0], nil, nil
	}
	r := manual.NewBuilderWithScheme("cablemesh-brokers")
	var st resolver.State
	for _, a := range addrs {
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(st)
	return r.Scheme() + ":///brokers", []grpc.DialOption{
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
	}, nil
}
