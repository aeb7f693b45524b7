package adminconfig

import (
	"strings"
	"testing"
)

func TestTheBrokerFieldListsReplicas(t *testing.T) {
	tests := []struct {
		name, broker, wantErr string
	}{
		{"two replicas", "10.0.0.1:7443,10.0.0.2:7443", ""},
		{"three replicas by name", "a.example:7443,b.example:7443,c.example:7443", ""},
		{"a replica without a port", "10.0.0.1:7443,10.0.0.2", `"10.0.0.2"`},
		{"an empty entry", "10.0.0.1:7443,", `""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig(t)
			c.Broker = tt.broker
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				conn, err := Dial(t.Context(), c)
				if err != nil {
					t.Fatal(err)
				}
				conn.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), "is not host:port[,host:port...]") || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}
