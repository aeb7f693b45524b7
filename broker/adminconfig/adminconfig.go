// Package adminconfig reads and writes the admin credential file (DIR/admin.yaml) that
// cable-broker writes on first start, and dials the broker's Admin API with it.
//
// File format (YAML, unknown fields are errors):
//
//	broker: 127.0.0.1:7443        # address to dial; replicas of an HA broker: a:7443,b:7443,
//	                              # tried in turn
//	ca: |                         # PEM of the mesh CA
//	certificate: |                # PEM of the admin client certificate
//	key: |                        # PEM of its private key
package adminconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Config is the admin credential.
type Config struct {
	Broker      string `json:"broker"`
	CA          string `json:"ca"`
	Certificate string `json:"certificate"`
	Key         string `json:"key"`
}

// Load reads and validates path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read admin config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("admin config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates the YAML of an admin config (strict: unknown fields are errors).
func Parse(b []byte) (*Config, error) {
	c := &Config{}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks that every field is present and that the key material parses.
func (c *Config) Validate() error {
	if c.Broker == "" {
		return errors.New("field broker is empty")
	}
	for _, a := range strings.Split(c.Broker, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("field broker %q is not host:port[,host:port...]: %q: %v", c.Broker, a, err)
		}
	}
	if c.CA == "" || c.Certificate == "" || c.Key == "" {
		return errors.New("fields ca, certificate and key must all be set")
	}
	if _, err := c.TLSConfig(); err != nil {
		return err
	}
	return nil
}

// Marshal encodes c as YAML.
func (c *Config) Marshal() ([]byte, error) { return yaml.Marshal(c) }

// TLSConfig returns the client TLS configuration: the admin certificate, and the mesh CA to
// verify the broker under apiv1.BrokerServerName.
func (c *Config) TLSConfig() (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(c.CA)) {
		return nil, errors.New("field ca holds no PEM certificate")
	}
	cert, err := tls.X509KeyPair([]byte(c.Certificate), []byte(c.Key))
	if err != nil {
		return nil, fmt.Errorf("fields certificate/key: %v", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   apiv1.BrokerServerName,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// Dial returns a client connection to the broker in c (connecting lazily, as grpc.NewClient
// does). With several broker addresses (replicas) it connects to the first that answers, in the
// order given, and moves to another when that one goes away. ctx is reserved for a future eager
// connect; closing the connection is the caller's job.
func Dial(_ context.Context, c *Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	tc, err := c.TLSConfig()
	if err != nil {
		return nil, err
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}, opts...)
	target := "passthrough:///" + c.Broker
	if addrs := strings.Split(c.Broker, ","); len(addrs) > 1 {
		r := manual.NewBuilderWithScheme("cablemesh-brokers")
		var st resolver.State
		for _, a := range addrs {
			st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
		}
		r.InitialState(st)
		target = r.Scheme() + ":///brokers"
		all = append(all, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"pick_first":{}}]}`))
	}
	conn, err := grpc.NewClient(target, all...)
	if err != nil {
		return nil, fmt.Errorf("dial broker %s: %w", c.Broker, err)
	}
	return conn, nil
}
