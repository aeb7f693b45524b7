package broker

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// An AgentCertificateLifetime outside its bounds fails New with an error naming the field and
// the value, and closes the store it was given.
func TestNewRefusesAnAgentCertificateLifetimeOutOfBounds(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, MinAgentCertificateLifetime / 2, pki.Validity + time.Hour} {
		st := &closeTracked{Store: store.NewMemory(store.Options{})}
		_, err := New(t.Context(), Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Store: st, AgentCertificateLifetime: d})
		if err == nil || !strings.Contains(err.Error(), "AgentCertificateLifetime") || !strings.Contains(err.Error(), d.String()) {
			t.Errorf("New with AgentCertificateLifetime %s = %v, want an error naming the field and the value", d, err)
		}
		if !st.closed.Load() {
			t.Errorf("New with AgentCertificateLifetime %s left its store open", d)
		}
	}
}

// closeTracked is a store that says whether it was closed.
type closeTracked struct {
	store.Store
	closed atomic.Bool
}

func (c *closeTracked) Close() error {
	c.closed.Store(true)
	return c.Store.Close()
}

// Agent certificates, from a join and from a renewal, last AgentCertificateLifetime, and start
// a tenth of it before they were issued (at most five minutes): two thirds into their validity,
// when the agent renews, is in the future.
func TestAgentCertificatesLastTheConfiguredLifetime(t *testing.T) {
	const life = 30 * time.Second
	b := startBroker(t, t.TempDir(), brokerOpts{certLifetime: life})
	before := time.Now()
	a := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "e1")
	checkLifetime := func(what string, certPEM []byte) {
		t.Helper()
		block, _ := pem.Decode(certPEM)
		if block == nil {
			t.Fatalf("%s: no certificate", what)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.NotAfter.Sub(c.NotBefore); got != life+life/10 {
			t.Errorf("%s certificate lasts %s, want %s", what, got, life+life/10)
		}
		if c.NotBefore.After(before) || c.NotBefore.Before(before.Add(-life/10-2*time.Second)) {
			t.Errorf("%s certificate starts %v, want about %s before %v", what, c.NotBefore, life/10, before)
		}
	}
	checkLifetime("joined", a.cert)
	resp, err := a.client(t, b.addr).RenewCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: csrPEM(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkLifetime("renewed", resp.CertificatePem)
}

// Config.UnaryInterceptors run after authentication: a call they refuse never reaches the
// service, and an unauthenticated call never reaches them.
func TestUnaryInterceptorsRunAfterAuthentication(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	refuse := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		seen = append(seen, info.FullMethod)
		mu.Unlock()
		if info.FullMethod == apiv1.Agent_Heartbeat_FullMethodName {
			return nil, status.Error(codes.Unavailable, "refused by the interceptor")
		}
		return h(ctx, req)
	}
	b := startBroker(t, t.TempDir(), brokerOpts{unary: []grpc.UnaryServerInterceptor{refuse}})
	a := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "e1")
	_, err := a.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
	wantCode(t, err, codes.Unavailable, "refused by the interceptor")
	_, err = apiv1.NewAgentClient(noCertConn(t, b.addr, a.ca)).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
	wantCode(t, err, codes.Unauthenticated)
	mu.Lock()
	defer mu.Unlock()
	want := []string{apiv1.Admin_CreateJoinToken_FullMethodName, apiv1.Agent_Join_FullMethodName, apiv1.Agent_Heartbeat_FullMethodName}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Errorf("the interceptor saw %v, want %v", seen, want)
	}
}
