package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestBadUsageExitsTwoBeforeTouchingTheDataDir(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown default cable driver", []string{"--data-dir", "/nonexistent/x", "--default-cable-driver", "gre"}, `default cable driver "gre" is not one of ipsec, vxlan, wireguard`},
		{"no data dir", []string{"--default-cable-driver", "vxlan"}, "--data-dir is required"},
		{"a lease under a second", []string{"--data-dir", "/nonexistent/x", "--lease", "10ms"}, "shorter than 1s"},
		{"a stray argument", []string{"--data-dir", "/nonexistent/x", "extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tt.args, &stderr); code != 2 || !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tt.want)
			}
		})
	}
}
