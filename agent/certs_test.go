package agent

import (
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/internal/testbroker"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
)

// readCert is the agent certificate in stateDir.
func readCert(t *testing.T, stateDir string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, brokerclient.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("agent.crt holds no PEM")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pemBlocks counts the certificates in a PEM file.
func pemBlocks(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return n
		}
		n++
	}
}

// joinedAndConnected starts an agent against b and waits until it joined, connected west and
// north, and heartbeats.
func joinedAndConnected(t *testing.T, b *testbroker.Broker, logs *syncbuf.Buffer) (*running, *fakedriver.Driver, string) {
	t.Helper()
	cfg := testConfig(t, b, true)
	d := fakedriver.New()
	r := startAgentWith(t, cfg, d, func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	eventually(t, "joined, connected and heartbeating", func() bool {
		_, _, beats := b.Counts()
		return connectedClusters(d) == "north,west" && beats > 0
	})
	return r, d, cfg.StateDir
}

// TestTheAgentRenewsItsCertificateTwoThirdsIntoItsLifetime: with short-lived
// certificates the agent renews before expiry, writes the new key and certificate, and its calls
// go on with the new certificate, without a restart and without touching its tunnels.
func TestTheAgentRenewsItsCertificateTwoThirdsIntoItsLifetime(t *testing.T) {
	b := newBroker(t, testbroker.Options{CertLifetime: 3 * time.Second})
	logs := &syncbuf.Buffer{}
	r, d, stateDir := joinedAndConnected(t, b, logs)
	first := readCert(t, stateDir)
	d.Calls()

	eventually(t, "a renewal", func() bool { return b.Renewals() >= 1 })
	var renewed *x509.Certificate
	eventually(t, "the new certificate on disk and in use", func() bool {
		renewed = readCert(t, stateDir)
		return renewed.SerialNumber.Cmp(first.SerialNumber) != 0 && b.LastSerial("east", "east-gw1") == renewed.SerialNumber.Text(16)
	})
	if at := b.Renewals(); at > 1 {
		t.Logf("%d renewals so far", at)
	}
	if fi, err := os.Stat(filepath.Join(stateDir, brokerclient.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent.key after the renewal: %v, %v", fi, err)
	}
	if _, err := brokerclient.LoadIdentity(stateDir); err != nil {
		t.Errorf("the renewed identity does not load: %v", err)
	}
	for _, c := range d.Calls() {
		t.Errorf("the renewal touched the tunnels: %v", c)
	}
	// The renewal happened at about two thirds of the first certificate's lifetime, not at its end.
	line := lineWith(logs.String(), "certificate renewed")
	if line == "" {
		t.Errorf("the log does not say the certificate was renewed")
	}
	t.Logf("log: %s", line)
	s, _ := getStatus(t, r.agent.cfg.StatusSocket)
	if s.Broker.CertificateNotAfter == nil || s.Broker.CertificateNotAfter.Before(first.NotAfter) {
		t.Errorf("status certificateNotAfter = %v, want the renewed certificate's (after %v)", s.Broker.CertificateNotAfter, first.NotAfter)
	}
	select {
	case err := <-r.done:
		t.Fatalf("the agent stopped: %v", err)
	default:
	}
}

// TestACARotationRenewsAtOnceAndSurvivesItsFinish (item 6): when the watch's CA bundle names a
// new issuing CA, the agent stores the bundle, renews at once from the new CA, and after the
// rotation finished (the broker serves with the new CA only) it still reaches the broker.
func TestACARotationRenewsAtOnceAndSurvivesItsFinish(t *testing.T) {
	b := newBroker(t)
	logs := &syncbuf.Buffer{}
	_, d, stateDir := joinedAndConnected(t, b, logs)
	first := readCert(t, stateDir)
	d.Calls()

	if err := b.RotateCA(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ca.crt holds both CAs", func() bool { return pemBlocks(t, filepath.Join(stateDir, brokerclient.CAFile)) == 2 })
	eventually(t, "a renewal from the new CA in use", func() bool {
		c := readCert(t, stateDir)
		return b.Renewals() == 1 && c.CheckSignatureFrom(b.IssuingCA()) == nil && b.LastSerial("east", "east-gw1") == c.SerialNumber.Text(16)
	})
	if c := readCert(t, stateDir); c.NotAfter.Before(first.NotAfter) {
		t.Errorf("renewed certificate expires %v, before the first (%v)", c.NotAfter, first.NotAfter)
	}

	// The overlap ends; the broker restarts so that every connection is new: the agent verifies
	// the broker's new serving certificate with the bundle it got, and carries on.
	if err := b.FinishRotation(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ca.crt holds only the new CA", func() bool { return pemBlocks(t, filepath.Join(stateDir, brokerclient.CAFile)) == 1 })
	b.Stop()
	if err := b.Start(b.Addr()); err != nil {
		t.Fatal(err)
	}
	_, _, before := b.Counts()
	b.UpsertCluster(&apiv1.Cluster{Name: "south", Id: 4, PodCidrs: []string{"10.4.0.0/16"}})
	b.UpsertEndpoint(remoteEndpoint("south", "s1", "127.0.0.14", "U09VVEgta2V5"))
	eventually(t, "south connected and heartbeats after the finish", func() bool {
		_, _, beats := b.Counts()
		return connectedClusters(d) == "north,south,west" && beats > before
	})
	for _, c := range d.Calls() {
		if c.Cluster != "south" {
			t.Errorf("the rotation touched a tunnel: %v", c)
		}
	}
	if b.Renewals() != 1 {
		t.Errorf("%d renewals, want 1", b.Renewals())
	}
}

// TestARevokedCertificateStopsTheCallsAndKeepsTheTunnels (item 6): a certificate the broker
// refused for good ("revoked") is not retried; the agent keeps its tunnels and says in status to
// join again.
func TestARevokedCertificateStopsTheCallsAndKeepsTheTunnels(t *testing.T) {
	b := newBroker(t)
	logs := &syncbuf.Buffer{}
	r, d, _ := joinedAndConnected(t, b, logs)
	d.Calls()
	if err := b.Revoke("east", "east-gw1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status says the certificate was revoked", func() bool {
		s, _ := getStatus(t, r.agent.cfg.StatusSocket)
		return !s.Broker.Connected && s.Broker.CertificateRefused && strings.Contains(s.Broker.Error, "certificate revoked: join again")
	})
	_, _, beats := b.Counts()
	time.Sleep(time.Second) // ten heartbeat intervals
	if _, _, now := b.Counts(); now != beats {
		t.Errorf("the agent kept calling the broker: %d heartbeats became %d", beats, now)
	}
	if got := connectedClusters(d); got != "north,west" {
		t.Errorf("tunnels after the revocation: %q", got)
	}
	for _, c := range d.Calls() {
		t.Errorf("the revocation touched the tunnels: %v", c)
	}
	select {
	case err := <-r.done:
		t.Fatalf("the agent stopped: %v", err)
	default:
	}
	s, _ := getStatus(t, r.agent.cfg.StatusSocket)
	t.Logf("broker status: %+v", s.Broker)
	t.Logf("log: %s", lineWith(logs.String(), "level=ERROR", "revoked"))
}
