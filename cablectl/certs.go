package cablectl

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
)

// Certificates: revoke-node and nodes (under cluster), cert list, admin renew, ca rotate.

func newRevokeNodeCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke-node CLUSTER NODE",
		Short: "Revoke one node's certificate, withdraw its gateway and exports; the cluster stays",
		Long: `Revokes every certificate of NODE: the broker refuses it on every call, and its open watch
ends at once. Its gateway endpoint and service exports are withdrawn. The cluster and its other
nodes are untouched, and the node name is free for a new join (with a new token, or with one
that joined this node before).`,
		Args: exactArgs(2, "CLUSTER and NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkClusterNames(args[0]); err != nil {
				return err
			}
			if err := validation.ValidateNodeName(args[1]); err != nil {
				return usagef("%v", err)
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.RevokeNode(ctx, &apiv1.RevokeNodeRequest{Cluster: args[0], Node: args[1]})
				if err != nil {
					return rpcError("revoke node", err)
				}
				extra := ""
				if resp.EndpointRemoved {
					extra += ", gateway endpoint withdrawn"
				}
				if resp.ExportsRemoved > 0 {
					extra += fmt.Sprintf(", %d service export(s) withdrawn", resp.ExportsRemoved)
				}
				return printResult(cmd.OutOrStdout(), f.output, fmt.Sprintf("node %s/%s revoked at %s%s", args[0], args[1], formatTime(resp.Node.GetRevokedAt()), extra),
					map[string]any{"cluster": args[0], "node": args[1], "revokedAt": formatTime(resp.Node.GetRevokedAt()),
						"endpointRemoved": resp.EndpointRemoved, "exportsRemoved": resp.ExportsRemoved})
			})
		},
	}
}

// nodeCertView is one node's certificate record, for cluster nodes and cert list.
type nodeCertView struct {
	Cluster      string     `json:"cluster"`
	Node         string     `json:"node"`
	Status       string     `json:"status"` // live, expired, revoked
	Serial       string     `json:"serial,omitempty"`
	NotAfter     *time.Time `json:"notAfter,omitempty"`
	Issuer       string     `json:"issuer,omitempty"`
	Certificates int        `json:"certificates"`
	RevokedAt    *time.Time `json:"revokedAt,omitempty"`
	Gateway      string     `json:"gateway,omitempty"`
}

func nodeViews(nodes []*apiv1.NodeCertificate, eps []*apiv1.Endpoint, cluster string, now time.Time) []nodeCertView {
	gw := map[string]string{}
	for _, e := range eps {
		gw[e.Cluster+"/"+e.Node] = e.PrivateIp
	}
	out := []nodeCertView{}
	for _, n := range nodes {
		if cluster != "" && n.Cluster != cluster {
			continue
		}
		v := nodeCertView{Cluster: n.Cluster, Node: n.Node, Certificates: len(n.Certificates), Gateway: gw[n.Cluster+"/"+n.Node]}
		if len(n.Certificates) > 0 {
			c := n.Certificates[0] // the newest
			v.Serial, v.Issuer = c.Serial, c.IssuerCa
			v.NotAfter = tsPtr(c.NotAfter.AsTime(), c.NotAfter != nil)
		}
		switch {
		case n.Revoked:
			v.Status = "revoked"
			v.RevokedAt = tsPtr(n.RevokedAt.AsTime(), n.RevokedAt != nil)
		case v.NotAfter != nil && !now.Before(*v.NotAfter):
			v.Status = "expired"
		default:
			v.Status = "live"
		}
		out = append(out, v)
	}
	return out
}

func newClusterNodesCmd(f *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes [CLUSTER]",
		Short: "List the nodes that joined (of one cluster, or all) with their certificates' expiry",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("%s takes at most one CLUSTER, got %q", cmd.CommandPath(), args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			cluster := ""
			if len(args) == 1 {
				cluster = args[0]
				if err := checkClusterNames(cluster); err != nil {
					return err
				}
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				certs, err := client.ListCertificates(ctx, &apiv1.ListCertificatesRequest{})
				if err != nil {
					return rpcError("list nodes", err)
				}
				cl, err := client.ListClusters(ctx, &apiv1.ListClustersRequest{})
				if err != nil {
					return rpcError("list nodes", err)
				}
				return printNodes(cmd.OutOrStdout(), f.output, nodeViews(certs.Nodes, cl.Endpoints, cluster, time.Now()), time.Now())
			})
		},
	}
}

func printNodes(w io.Writer, format string, nodes []nodeCertView, now time.Time) error {
	if format != "table" {
		return printData(w, format, map[string]any{"nodes": nodes})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNODE\tSTATUS\tCERT-NOT-AFTER\tEXPIRES-IN\tCA\tSERIAL\tGATEWAY")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Cluster, n.Node, n.Status, formatTimePtr(n.NotAfter), expiresIn(n.NotAfter, now),
			orNone(shortHash(n.Issuer)), orNone(shortSerial(n.Serial)), orNone(n.Gateway))
	}
	return tw.Flush()
}

// certView is one certificate of cert list.
type certView struct {
	Kind         string     `json:"kind"` // admin, ca, node
	Name         string     `json:"name"`
	Status       string     `json:"status"`
	NotAfter     *time.Time `json:"notAfter,omitempty"`
	Serial       string     `json:"serial,omitempty"`
	TrustedUntil *time.Time `json:"trustedUntil,omitempty"`
}

func newCertCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Certificates of the mesh: list them with their expiry",
	}
	f := newAdminFlags(g, cmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the admin certificate (of --config), the mesh CAs and every node's certificate, with expiry dates",
		Args:  exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.ListCertificates(ctx, &apiv1.ListCertificatesRequest{})
				if err != nil {
					return rpcError("list certificates", err)
				}
				return printCerts(cmd.OutOrStdout(), f.output, certViews(resp, time.Now()), time.Now())
			})
		},
	})
	return cmd
}

func certViews(resp *apiv1.ListCertificatesResponse, now time.Time) []certView {
	var out []certView
	if a := resp.Admin; a != nil {
		v := certView{Kind: "admin", Name: "admin (this --config)", Serial: a.Serial, NotAfter: tsPtr(a.NotAfter.AsTime(), a.NotAfter != nil)}
		v.Status = liveOrExpired(v.NotAfter, now)
		out = append(out, v)
	}
	for _, c := range resp.Cas {
		var roles []string
		if c.Issuing {
			roles = append(roles, "issuing")
		}
		if c.Serving {
			roles = append(roles, "serving")
		}
		if c.TrustedUntil != nil {
			roles = append(roles, "previous")
		}
		out = append(out, certView{Kind: "ca", Name: c.Hash, Status: strings.Join(roles, ","), NotAfter: tsPtr(c.NotAfter.AsTime(), c.NotAfter != nil),
			TrustedUntil: tsPtr(c.TrustedUntil.AsTime(), c.TrustedUntil != nil)})
	}
	for _, n := range nodeViews(resp.Nodes, nil, "", now) {
		out = append(out, certView{Kind: "node", Name: n.Cluster + "/" + n.Node, Status: n.Status, NotAfter: n.NotAfter, Serial: n.Serial})
	}
	return out
}

func printCerts(w io.Writer, format string, certs []certView, now time.Time) error {
	if format != "table" {
		return printData(w, format, map[string]any{"certificates": certs})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tSTATUS\tNOT-AFTER\tEXPIRES-IN\tNOTE")
	for _, c := range certs {
		note := "-"
		if c.TrustedUntil != nil {
			note = "trusted until " + formatTimePtr(c.TrustedUntil)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Kind, c.Name, c.Status, formatTimePtr(c.NotAfter), expiresIn(c.NotAfter, now), note)
	}
	return tw.Flush()
}

func liveOrExpired(t *time.Time, now time.Time) string {
	if t != nil && !now.Before(*t) {
		return "expired"
	}
	return "live"
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

func formatTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func expiresIn(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	if !now.Before(*t) {
		return "expired"
	}
	return humanAge(t.Sub(now))
}

// shortHash is a CA fingerprint ("sha256:<hex>") cut to its first 12 hex digits.
func shortHash(h string) string {
	if len(h) > len("sha256:")+12 {
		return h[:len("sha256:")+12]
	}
	return h
}

func shortSerial(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

func newAdminCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "The admin credential (--config)",
	}
	f := newAdminFlags(g, cmd)
	var out string
	renew := &cobra.Command{
		Use:   "renew [--out FILE]",
		Short: "Get a new admin certificate (new key) and write a fresh admin.yaml",
		Long: `Creates a new key, has the broker issue an admin certificate for it (authenticated by the
current one) and writes an admin.yaml with it and the broker's current CA bundle: over --config
itself (atomically, 0600), or to --out. The old certificate keeps working until it expires. Run it
before the admin certificate expires (cablectl cert list shows when) and after a CA rotation.`,
		Args: exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := adminconfig.Load(f.config)
			if err != nil {
				return err
			}
			path := f.config
			if out != "" {
				path = out
			}
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				return err
			}
			der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "cablemesh-admin"}}, key)
			if err != nil {
				return err
			}
			var resp *apiv1.RenewCertificateResponse
			err = f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err = client.RenewAdminCertificate(ctx, &apiv1.RenewCertificateRequest{CsrPem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})})
				if err != nil {
					return rpcError("renew admin certificate", err)
				}
				return nil
			})
			if err != nil {
				return err
			}
			kder, err := x509.MarshalECPrivateKey(key)
			if err != nil {
				return err
			}
			cfg.CA, cfg.Certificate = string(resp.CaPem), string(resp.CertificatePem)
			cfg.Key = string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("renew admin certificate: the broker's answer: %w", err)
			}
			b, err := cfg.Marshal()
			if err != nil {
				return err
			}
			if err := writeFileAtomic(path, b); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: admin certificate valid until %s\n", path, formatTime(resp.NotAfter))
			return err
		},
	}
	renew.Flags().StringVar(&out, "out", "", "write the new admin.yaml here instead of over --config")
	cmd.AddCommand(renew)
	return cmd
}

// writeFileAtomic writes data to path with mode 0600 through a temporary file in its directory.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func newCACmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "The mesh CA: rotate it with an overlap in which both CAs are trusted",
	}
	f := newAdminFlags(g, cmd)
	var (
		overlap time.Duration
		finish  bool
	)
	rotate := &cobra.Command{
		Use:   "rotate [--overlap 720h] | --finish",
		Short: "Create a new mesh CA (both trusted during --overlap), or end the overlap now (--finish)",
		Long: `Creates a new mesh CA. From now on every certificate (joins, renewals, the admin's) comes
from the new CA; certificates of either CA are accepted until the overlap ends; the broker's
serving certificate stays with the old CA until then, so that every client still verifies it,
and agents receive both CAs on their watch (and in every join and renewal answer). The broker
rewrites its own admin.yaml with a new-CA admin certificate and both CAs. When the overlap ends
(automatically, or now with --finish) the old CA is dropped and the broker serves from the new
one: by then every agent must have renewed its certificate (agents do on their own when they
see the new issuing CA) and every admin.yaml must hold the new CA (cablectl admin renew).`,
		Args: exactArgs(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if overlap < 0 || overlap%time.Second != 0 {
				return usagef("--overlap %s: must be positive whole seconds", overlap)
			}
			if finish && cmd.Flags().Changed("overlap") {
				return usagef("--finish takes no --overlap")
			}
			return f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
				resp, err := client.RotateCA(ctx, &apiv1.RotateCARequest{OverlapSeconds: int64(overlap / time.Second), Finish: finish})
				if err != nil {
					return rpcError("rotate CA", err)
				}
				w := cmd.OutOrStdout()
				for _, c := range resp.Cas {
					role := "issuing"
					if c.TrustedUntil != nil {
						role = "previous, trusted until " + formatTime(c.TrustedUntil)
					}
					if c.Serving {
						role += ", serving"
					}
					if _, err := fmt.Fprintf(w, "CA %s (%s), valid until %s\n", c.Hash, role, formatTime(c.NotAfter)); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	rotate.Flags().DurationVar(&overlap, "overlap", 0, "how long the old CA stays trusted (default 720h: 30 days)")
	rotate.Flags().BoolVar(&finish, "finish", false, "end the overlap of the rotation in progress now")
	cmd.AddCommand(rotate)
	return cmd
}
