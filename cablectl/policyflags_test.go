package cablectl

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestPolicyFromFlags(t *testing.T) {
	three := 3
	tests := []struct {
		name    string
		flags   policyFlags
		want    string // the policy as one line of JSON spec
		wantErr string
	}{
		{
			name: "the seed's on-prem policy can be written with flags",
			flags: policyFlags{Name: "on-prem", LeftClusterSelector: "location=on-premise", RightClusterSelector: "location=on-premise",
				Topology: "point-to-point", Priority: &three, ConnectionPolicy: "connect", CableDriver: "vxlan", CableConfig: "vni=100"},
			want: `{"leftClusterSelector":{"matchLabels":{"location":"on-premise"}},"rightClusterSelector":{"matchLabels":{"location":"on-premise"}},"topology":"point-to-point","priority":3,"connectionPolicy":"connect","cableDriver":{"name":"vxlan","options":{"vni":"100"}}}`,
		},
		{
			name:  "an explicitly empty right selector is kept as the selector of every cluster",
			flags: policyFlags{Name: "cs", LeftClusterSelector: "database-server=true", RightSet: true, Topology: "client-server"},
			want:  `{"leftClusterSelector":{"matchLabels":{"database-server":"true"}},"rightClusterSelector":{},"topology":"client-server"}`,
		},
		{
			name:    "a bad selector names its flag",
			flags:   policyFlags{Name: "x", ClusterSelector: "a in (b"},
			wantErr: "--cluster-selector",
		},
		{
			name:    "a bad topology is named",
			flags:   policyFlags{Name: "x", Topology: "star"},
			wantErr: `spec.topology: "star"`,
		},
		{
			name:    "options without a driver are an error",
			flags:   policyFlags{Name: "x", CableConfig: "vni=1"},
			wantErr: "spec.cableDriver.name: required",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := policyFromFlags(tt.flags)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(p.Spec)
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}
