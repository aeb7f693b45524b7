package cablectl

import (
	"bytes"
	"testing"
	"time"
)

// The tables of `cluster nodes` and `cert list`, against their golden files.
func TestCertificateTablesMatchGolden(t *testing.T) {
	in := func(d time.Duration) *time.Time { x := statusNow.Add(d); return &x }
	nodes := []nodeCertView{
		{Cluster: "east", Node: "east-gw1", Status: "live", Serial: "1f2e3d4c5b6a79881f2e3d4c5b6a7988", NotAfter: in(89 * 24 * time.Hour),
			Issuer: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Certificates: 2, Gateway: "172.31.0.10"},
		{Cluster: "east", Node: "east-gw2", Status: "revoked", Serial: "aa", NotAfter: in(30 * 24 * time.Hour), RevokedAt: in(-time.Hour)},
		{Cluster: "west", Node: "west-gw1", Status: "expired", NotAfter: in(-50 * time.Hour)},
	}
	var buf bytes.Buffer
	if err := printNodes(&buf, "table", nodes, statusNow); err != nil {
		t.Fatal(err)
	}
	golden(t, "cluster-nodes.golden", buf.Bytes())

	certs := []certView{
		{Kind: "admin", Name: "admin (this --config)", Status: "live", NotAfter: in(364 * 24 * time.Hour), Serial: "01"},
		{Kind: "ca", Name: "9f86d081884c", Status: "issuing,serving", NotAfter: in(3650 * 24 * time.Hour)},
		{Kind: "ca", Name: "60303ae22b99", Status: "previous", NotAfter: in(300 * 24 * time.Hour), TrustedUntil: in(30 * 24 * time.Hour)},
		{Kind: "node", Name: "east/east-gw1", Status: "live", NotAfter: in(89 * 24 * time.Hour)},
	}
	buf.Reset()
	if err := printCerts(&buf, "table", certs, statusNow); err != nil {
		t.Fatal(err)
	}
	golden(t, "cert-list.golden", buf.Bytes())
}
