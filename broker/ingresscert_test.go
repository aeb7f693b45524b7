package broker

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"strings"
	"testing"
)

func TestRefuseIngressCertificate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cert   *x509.Certificate
		refuse bool
	}{
		{"by organization", &x509.Certificate{Subject: pkix.Name{CommonName: "gw", Organization: []string{"cablemesh:ingress:east"}}}, true},
		{"by URI, even with an agent's organization", &x509.Certificate{Subject: pkix.Name{CommonName: "gw", Organization: []string{"cablemesh:cluster:east"}},
			URIs: []*url.URL{{Scheme: "cablemesh", Host: "ingress", Path: "/east/node/gw"}}}, true},
		{"an agent certificate", &x509.Certificate{Subject: pkix.Name{CommonName: "gw", Organization: []string{"cablemesh:cluster:east"}},
			URIs: []*url.URL{{Scheme: "cablemesh", Host: "cluster", Path: "/east/node/gw"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := refuseIngressCertificate(tc.cert)
			if tc.refuse != (err != nil) {
				t.Fatalf("refused: %v, want refused %v", err, tc.refuse)
			}
			if err != nil && !strings.Contains(err.Error(), "ingress certificate") {
				t.Errorf("error %q does not say why", err)
			}
		})
	}
}
