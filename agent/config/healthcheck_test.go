package config

import (
	"strings"
	"testing"
	"time"
)

func TestHealthCheckDefaultsAndValues(t *testing.T) {
	base := "cluster: east\nnode: n1\nbroker: 10.0.0.1:7443\n"
	off := false
	tests := []struct {
		name string
		yaml string
		want HealthCheck
	}{
		{"no healthCheck section probes every 300ms, 3 failures, a 300ms timeout", base,
			HealthCheck{Period: 300 * time.Millisecond, Timeout: 300 * time.Millisecond, FailureThreshold: 3, Window: 128}},
		{"Linkerd's 3s x 3 with a 2s timeout stays reachable", base + "healthCheck: {period: 3s, timeout: 2s}\n",
			HealthCheck{Period: 3 * time.Second, Timeout: 2 * time.Second, FailureThreshold: 3, Window: 128}},
		{"every field is read", base + "healthCheck: {enabled: true, period: 1s, timeout: 300ms, failureThreshold: 5, window: 16}\n",
			HealthCheck{Period: time.Second, Timeout: 300 * time.Millisecond, FailureThreshold: 5, Window: 16}},
		{"a short period alone brings the default timeout down to it", base + "healthCheck: {period: 200ms}\n",
			HealthCheck{Period: 200 * time.Millisecond, Timeout: 200 * time.Millisecond, FailureThreshold: 3, Window: 128}},
		{"probing can be switched off", base + "healthCheck:\n  enabled: false\n",
			HealthCheck{Enabled: &off, Period: 300 * time.Millisecond, Timeout: 300 * time.Millisecond, FailureThreshold: 3, Window: 128}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			h := c.HealthCheck
			if h.Enabled == nil {
				t.Fatal("enabled was not defaulted")
			}
			wantOn := tt.want.Enabled == nil || *tt.want.Enabled
			if h.IsEnabled() != wantOn {
				t.Errorf("enabled = %v, want %v", h.IsEnabled(), wantOn)
			}
			h.Enabled, tt.want.Enabled = nil, nil
			if h != tt.want {
				t.Errorf("healthCheck = %+v, want %+v", h, tt.want)
			}
		})
	}
}

func TestBadHealthCheckFailsNamingTheField(t *testing.T) {
	base := "cluster: east\nnode: n1\nbroker: 10.0.0.1:7443\n"
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"an unknown healthCheck field is refused with its name and line", base + "healthCheck:\n  interval: 3s\n", []string{"line 5", `unknown field "interval"`}},
		{"a period too short names the value", base + "healthCheck: {period: 10ms}\n", []string{`healthCheck.period: "10ms"`, "100ms..1h"}},
		{"a negative period names the value", base + "healthCheck: {period: -3s}\n", []string{`healthCheck.period: "-3s"`}},
		{"a period too long names the value", base + "healthCheck: {period: 2h}\n", []string{`healthCheck.period: "2h0m0s"`}},
		{"a bare number as period is refused", base + "healthCheck: {period: 3}\n", []string{"line 4"}},
		{"a timeout longer than the period is refused", base + "healthCheck: {period: 1s, timeout: 2s}\n", []string{`healthCheck.timeout: "2s"`, "healthCheck.period (1s)"}},
		{"a timeout too short names the value", base + "healthCheck: {timeout: 1ms}\n", []string{`healthCheck.timeout: "1ms"`}},
		{"a zero-or-less failure threshold names the value", base + "healthCheck: {failureThreshold: -1}\n", []string{"healthCheck.failureThreshold: -1"}},
		{"a failure threshold too large names the value", base + "healthCheck: {failureThreshold: 1000}\n", []string{"healthCheck.failureThreshold: 1000"}},
		{"a window too large names the value", base + "healthCheck: {window: 100000}\n", []string{"healthCheck.window: 100000"}},
		{"enabled must be a bool", base + "healthCheck: {enabled: sometimes}\n", []string{"line 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tt.yaml)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
