package exports

import (
	"strconv"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestMergeExports(t *testing.T) {
	e := func(ns, name string, port uint32) *apiv1.ServiceExport {
		return &apiv1.ServiceExport{Namespace: ns, Name: name, Type: "ClusterSetIP", Ports: []*apiv1.ServicePort{{Port: port, Protocol: "TCP"}}}
	}
	tests := []struct {
		name               string
		cfg, runtime, kube []*apiv1.ServiceExport
		want               []string // namespace/name:port of the set
		shadowed           map[string]string
	}{
		{"every source adds its services", []*apiv1.ServiceExport{e("shop", "web", 80)}, []*apiv1.ServiceExport{e("shop", "api", 81)}, []*apiv1.ServiceExport{e("ops", "db", 82)},
			[]string{"ops/db:82", "shop/api:81", "shop/web:80"}, nil},
		{"the config wins over a runtime export of the same service", []*apiv1.ServiceExport{e("shop", "web", 80)}, []*apiv1.ServiceExport{e("shop", "web", 8080)}, nil,
			[]string{"shop/web:80"}, map[string]string{SourceRuntime: SourceConfig}},
		{"a runtime export wins over Kubernetes", nil, []*apiv1.ServiceExport{e("shop", "web", 8080)}, []*apiv1.ServiceExport{e("shop", "web", 9090)},
			[]string{"shop/web:8080"}, map[string]string{SourceKubernetes: SourceRuntime}},
		{"no source, no exports", nil, nil, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, rows := MergeExports(tt.cfg, tt.runtime, tt.kube)
			var got []string
			for _, x := range set {
				got = append(got, x.GetNamespace()+"/"+x.GetName()+":"+strconv.Itoa(int(x.GetPorts()[0].GetPort())))
			}
			if len(got) != len(tt.want) {
				t.Fatalf("set %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("set %v, want %v", got, tt.want)
				}
			}
			if len(rows) != len(tt.cfg)+len(tt.runtime)+len(tt.kube) {
				t.Errorf("rows %+v: want one per export of every source", rows)
			}
			for _, r := range rows {
				if w := tt.shadowed[r.Source]; r.Shadowed != w {
					t.Errorf("%s export shadowed by %q, want %q", r.Source, r.Shadowed, w)
				}
			}
		})
	}
}
