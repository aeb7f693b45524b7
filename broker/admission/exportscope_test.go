package admission

import (
	"errors"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestCheckExportScope(t *testing.T) {
	east := &apiv1.Cluster{Name: "east", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.101.0.0/16"}}
	eastGW := &apiv1.Cluster{Name: "east", PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true}
	exp := func(ips ...string) *apiv1.ServiceExport {
		e := &apiv1.ServiceExport{Namespace: "shop", Name: "api"}
		for _, ip := range ips {
			e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: ip, Ready: true})
		}
		return e
	}
	tests := []struct {
		name      string
		c         *apiv1.Cluster
		req       []*apiv1.ServiceExport
		wantErr   string // empty: accepted
		wantField string
		wantMesh  bool // the mesh addresses are read
	}{
		{name: "pod and service IPs", c: east, req: []*apiv1.ServiceExport{exp("10.1.0.5", "10.101.0.9"), exp()}},
		{name: "loopback in the second export", c: east, req: []*apiv1.ServiceExport{exp("10.1.0.5"), exp("10.1.0.6", "127.0.0.1")},
			wantErr: "exports[1].endpoints[1].ip 127.0.0.1 is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs [10.101.0.0/16]", wantField: "exports[1].endpoints[1].ip"},
		{name: "the metadata service", c: east, req: []*apiv1.ServiceExport{exp("169.254.169.254")}, wantErr: "exports[0].endpoints[0].ip 169.254.169.254 is not in", wantField: "exports[0].endpoints[0].ip"},
		{name: "another cluster's pod", c: east, req: []*apiv1.ServiceExport{exp("10.2.0.1")}, wantErr: "10.2.0.1 is not in cluster east's"},
		{name: "a mesh address outside gateway mode is not read", c: east, req: []*apiv1.ServiceExport{exp("242.0.0.1")}, wantErr: "242.0.0.1 is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs [10.101.0.0/16]"},
		{name: "a gateway-mode cluster's pod IP reads no mesh address", c: eastGW, req: []*apiv1.ServiceExport{exp("10.1.0.5")}},
		{name: "its gateway's mesh address in gateway mode", c: eastGW, req: []*apiv1.ServiceExport{exp("10.1.0.5", "242.0.0.1")}, wantMesh: true},
		{name: "another gateway's mesh address in gateway mode", c: eastGW, req: []*apiv1.ServiceExport{exp("242.0.0.2")}, wantMesh: true,
			wantErr: "exports[0].endpoints[0].ip 242.0.0.2 is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs [], nor a mesh address of its gateways [242.0.0.1]"},
		{name: "no cluster: left to PlanExports", c: nil, req: []*apiv1.ServiceExport{exp("127.0.0.1")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := false
			err := CheckExportScope(tt.c, tt.req, func() ([]string, error) { read = true; return []string{"242.0.0.1"}, nil })
			if read != tt.wantMesh {
				t.Errorf("mesh addresses read: %v, want %v", read, tt.wantMesh)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var inv *InvalidError
			if !errors.As(err, &inv) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an *InvalidError containing %q", err, tt.wantErr)
			}
			if tt.wantField != "" && inv.Field != tt.wantField {
				t.Fatalf("field %q, want %q", inv.Field, tt.wantField)
			}
		})
	}
}

func TestCheckExportScopeSaysWhenTheMeshAddressesCannotBeRead(t *testing.T) {
	c := &apiv1.Cluster{Name: "east", PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true}
	boom := errors.New("boom")
	err := CheckExportScope(c, []*apiv1.ServiceExport{{Endpoints: []*apiv1.ServiceEndpoint{{Ip: "242.0.0.1"}}}}, func() ([]string, error) { return nil, boom })
	var inv *InvalidError
	if !errors.Is(err, boom) || errors.As(err, &inv) {
		t.Fatalf("got %v, want the read error, not a refusal", err)
	}
}
