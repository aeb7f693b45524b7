package adminconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/broker/pki"
)

func validConfig(t *testing.T) *Config {
	t.Helper()
	p, _, err := pki.LoadOrCreate(t.TempDir(), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &Config{Broker: "127.0.0.1:7443", CA: string(p.CAPEM), Certificate: string(p.AdminCert), Key: string(p.AdminKey)}
}

func TestConfigRoundTripsAndIsStrict(t *testing.T) {
	c := validConfig(t)
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil || *got != *c {
		t.Fatalf("round trip: %v", err)
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"an unknown field is refused", string(b) + "extra: 1\n", "unknown field"},
		{"a missing broker is refused", strings.Replace(string(b), "broker: 127.0.0.1:7443", "", 1), "field broker is empty"},
		{"a broker without a port is refused", strings.Replace(string(b), "broker: 127.0.0.1:7443", "broker: 127.0.0.1", 1), `field broker "127.0.0.1" is not host:port`},
	}
	other := validConfig(t)
	mismatched := *c
	mismatched.Key = other.Key
	mb, _ := mismatched.Marshal()
	tests = append(tests, struct{ name, yaml, want string }{"a key that does not match the certificate is refused", string(mb), "fields certificate/key"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse([]byte(tt.yaml)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("broker: a:1\nca: x\ncertificate: y\nkey: z\n"))
	f.Add([]byte("{}"))
	f.Add([]byte("broker: [1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err == nil && (c.Broker == "" || c.CA == "") {
			t.Fatalf("accepted an incomplete config %+v", c)
		}
	})
}
