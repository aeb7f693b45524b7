package cablectl

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cablectl/diagnose"
)

// fixtureDiagnosis is one diagnosis with passing and failing checks.
func fixtureDiagnosis() []diagnose.Result {
	s := fixtureStatusWithProbes()
	na := statusNow.Add(80 * 24 * time.Hour)
	s.Broker.CertificateNotAfter = &na
	skew := 2500.0
	s.Broker.ClockSkewMs = &skew
	s.Decisions = []statusapi.Decision{{Cluster: "west", Connect: true, Driver: "wireguard", Policy: "default"}}
	p := diagnose.Probes{MTU: map[string]diagnose.MTUProbe{
		"west":  {Source: "10.1.0.1", Target: "10.2.0.1", MTU: 1420, Size: 1392, Sent: 3, Received: 0, SmallSent: 3, SmallReceived: 3},
		"south": {Source: "10.1.0.1", Target: "10.4.0.1", MTU: 1420, Size: 1392, Sent: 3, SmallSent: 3},
	}}
	return diagnose.Run(s, p, statusNow)
}

func TestDiagnoseTableMatchesGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := printDiagnose(&buf, "table", fixtureDiagnosis()); err != nil {
		t.Fatal(err)
	}
	golden(t, "diagnose.golden", buf.Bytes())
}

func TestDiagnoseCommandExitCodesAndJSON(t *testing.T) {
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("skipping: ping (iputils-ping) is not installed")
	}
	// A status without connections, services or ipsec: only broker, certificate and clock.
	s := &statusapi.Status{Cluster: "east", Gateway: true, Connections: []statusapi.Connection{},
		Broker: statusapi.Broker{Address: "10.0.0.1:7443", Connected: true, Revision: 3}}
	na := time.Now().Add(30 * 24 * time.Hour)
	s.Broker.CertificateNotAfter = &na
	sock := serveStatus(t, s)
	out, err := runCablectl("diagnose", "--socket", sock, "-o", "json")
	if err != nil || ExitCode(err) != 0 {
		t.Fatalf("diagnose of a healthy node: %v (exit %d)\n%s", err, ExitCode(err), out)
	}
	var rs []map[string]any
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("not a JSON list: %v\n%s", err, out)
	}
	if len(rs) != 3 {
		t.Fatalf("results %v, want broker, certificate, clock-skew", rs)
	}
	for _, r := range rs {
		for _, k := range []string{"check", "ok", "message"} {
			if _, ok := r[k]; !ok {
				t.Errorf("result %v lacks %q", r, k)
			}
		}
	}

	s.Broker.Connected, s.Broker.Error = false, "connection refused"
	sock = serveStatus(t, s)
	out, err = runCablectl("diagnose", "--socket", sock)
	var cf errChecksFailed
	if !errors.As(err, &cf) || ExitCode(err) != 1 || cf.failed != 1 {
		t.Errorf("diagnose with the broker gone: %v (exit %d), want 1 failed check, exit 1", err, ExitCode(err))
	}
	if !strings.Contains(out, "✗ broker: not connected to the broker 10.0.0.1:7443: connection refused") || !strings.Contains(out, "    hint: ") ||
		!strings.Contains(out, "✓ certificate: ") || !strings.Contains(out, "1 of 3 checks failed") {
		t.Errorf("table:\n%s", out)
	}

	_, err = runCablectl("diagnose", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if ExitCode(err) != 1 {
		t.Errorf("unreachable agent: %v (exit %d), want exit 1", err, ExitCode(err))
	}
	_, err = runCablectl("diagnose", "--socket", sock, "-o", "wide")
	if ExitCode(err) != 2 {
		t.Errorf("-o wide: %v (exit %d), want exit 2", err, ExitCode(err))
	}
}

func TestParsePing(t *testing.T) {
	for _, tc := range []struct {
		name, out      string
		sent, received int
		err            string
	}{
		{"all answered", "PING 10.2.0.1 (10.2.0.1) from 10.1.0.1 : 1392(1420) bytes of data.\n1400 bytes from 10.2.0.1: icmp_seq=1 ttl=64 time=0.1 ms\n\n--- 10.2.0.1 ping statistics ---\n3 packets transmitted, 3 received, 0% packet loss, time 401ms\n", 3, 3, ""},
		{"black hole", "PING 10.2.0.1 (10.2.0.1) from 10.1.0.1 : 1392(1420) bytes of data.\n\n--- 10.2.0.1 ping statistics ---\n3 packets transmitted, 0 received, 100% packet loss, time 2040ms\n", 3, 0, ""},
		{"local refusal", "PING 10.2.0.1 (10.2.0.1) 1472(1500) bytes of data.\nping: local error: message too long, mtu=1420\n\n--- 10.2.0.1 ping statistics ---\n3 packets transmitted, 0 received, +3 errors, 100% packet loss\n", 3, 0, "ping: ping: local error: message too long, mtu=1420"},
		{"bad source", "ping: bind icmp socket: Cannot assign requested address\n", 0, 0, "ping: exit status 2: ping: bind icmp socket: Cannot assign requested address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runErr error
			if tc.sent == 0 {
				runErr = errors.New("exit status 2")
			}
			r := parsePing(tc.out, runErr)
			if r.sent != tc.sent || r.received != tc.received || r.err != tc.err {
				t.Errorf("parsePing = %+v, want sent %d received %d err %q", r, tc.sent, tc.received, tc.err)
			}
		})
	}
}

// FuzzParsePing: ping's output is outside input; parsePing never panics and never counts more
// answers than probes from a well-formed summary.
func FuzzParsePing(f *testing.F) {
	f.Add("3 packets transmitted, 3 received, 0% packet loss")
	f.Add("ping: local error: message too long, mtu=1400\n3 packets transmitted, 0 received")
	f.Add("")
	f.Fuzz(func(t *testing.T, out string) {
		r := parsePing(out, errors.New("exit status 1"))
		if r.sent < 0 || r.received < 0 {
			t.Errorf("negative counts %+v", r)
		}
	})
}
