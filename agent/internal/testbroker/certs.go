package testbroker

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// rotationOverlap is how long the previous CA stays trusted after RotateCA.
const rotationOverlap = time.Hour

// loadPKI reads the broker's key material from its data dir, as the broker left it (a CA
// rotation rewrites it there). The serving addresses are the broker's for a loopback listener.
func (b *Broker) loadPKI() *pki.PKI {
	p, _, err := pki.LoadOrCreate(b.dir, []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback}, time.Now())
	if err != nil {
		panic(fmt.Sprintf("testbroker: read the broker's PKI: %v", err))
	}
	return p
}

// IssuingCA is the CA new certificates come from.
func (b *Broker) IssuingCA() *x509.Certificate { return b.loadPKI().CACert }

// CAHash is the fingerprint join tokens pin: the serving CA's.
func (b *Broker) CAHash() string { return b.loadPKI().CAHash() }

// admin runs fn with an Admin client of the broker's own admin credential (admin.yaml, which a
// CA rotation rewrites), on a connection of its own.
func (b *Broker) admin(fn func(context.Context, apiv1.AdminClient) error) error {
	cfg, err := adminconfig.Load(filepath.Join(b.dir, broker.AdminConfigFile))
	if err != nil {
		return err
	}
	cfg.Broker = b.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := adminconfig.Dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	return fn(ctx, apiv1.NewAdminClient(conn))
}

// RotateCA starts a CA rotation through the Admin API: a new CA issues every certificate from
// now on, both are trusted for an hour, the old one still serves; watches get the new bundle.
func (b *Broker) RotateCA() error {
	return b.admin(func(ctx context.Context, c apiv1.AdminClient) error {
		_, err := c.RotateCA(ctx, &apiv1.RotateCARequest{OverlapSeconds: int64(rotationOverlap / time.Second)})
		return err
	})
}

// FinishRotation ends the rotation's overlap through the Admin API: the new CA serves and is the
// only one trusted.
func (b *Broker) FinishRotation() error {
	return b.admin(func(ctx context.Context, c apiv1.AdminClient) error {
		_, err := c.RotateCA(ctx, &apiv1.RotateCARequest{Finish: true})
		return err
	})
}

// Revoke revokes every certificate of cluster/node through the Admin API: its record says
// revoked, its endpoint is withdrawn; its calls are refused, its watch ends.
func (b *Broker) Revoke(cluster, node string) error {
	return b.admin(func(ctx context.Context, c apiv1.AdminClient) error {
		_, err := c.RevokeNode(ctx, &apiv1.RevokeNodeRequest{Cluster: cluster, Node: node})
		return err
	})
}

// GoodSerials are the serials of cluster/node's certificates the broker accepts, newest first.
func (b *Broker) GoodSerials(cluster, node string) []string {
	var out []string
	b.view(func(tx store.ReadTx) error {
		rec, err := tx.NodeCertificate(cluster, node)
		if rec != nil && !rec.Revoked {
			for _, c := range rec.Certificates {
				out = append(out, c.Serial)
			}
		}
		return err
	})
	return out
}
