package harness

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// AgentCert is the certificate in the gateway agent's state dir (agent.crt).
func (c *Cluster) AgentCert() (*x509.Certificate, error) {
	certs, err := readPEMCerts(filepath.Join(c.StateDir, "agent.crt"))
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// AgentCAs are the CAs the gateway agent trusts (its state dir's ca.crt).
func (c *Cluster) AgentCAs() ([]*x509.Certificate, error) {
	return readPEMCerts(filepath.Join(c.StateDir, "ca.crt"))
}

func readPEMCerts(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no certificate", path)
	}
	return out, nil
}

// LinkIndex is the interface index of link in namespace ns (0 when it does not exist): a link
// deleted and created again gets a new one.
func (m *Mesh) LinkIndex(ns, link string) int {
	r := Run(m.Ctx, "ip", "-n", ns, "-o", "link", "show", "dev", link)
	if r.Err != nil {
		return 0
	}
	idx, _, _ := strings.Cut(r.Stdout, ":")
	n, _ := strconv.Atoi(strings.TrimSpace(idx))
	return n
}

// AllRoutes lists the routes of namespace ns in every table (`ip route show table all`), one a
// line.
func (m *Mesh) AllRoutes(ns string) []string {
	var out []string
	for _, fam := range []string{"-4", "-6"} {
		r := Run(m.Ctx, "ip", fam, "-n", ns, "route", "show", "table", "all")
		for _, l := range strings.Split(r.Stdout, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}
