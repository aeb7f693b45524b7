package brokerlink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// The agent's certificate over its life (the identity in stateDir: agent.key, agent.crt and the
// CA bundle ca.crt):
//
//   - The watch's CA bundle (WatchResponse.ca, on the first message and at every CA change)
//     replaces ca.crt and the CAs every later handshake verifies the broker with.
//   - certLoop renews the certificate over the current one (Agent.RenewCertificate) two thirds
//     into its lifetime, or at once when the bundle names another issuing CA (a CA rotation),
//     writes the new key and certificate, and moves the broker connection to a new one that
//     presents it: calls in flight finish on the old connection, the watch resumes on the new
//     one from its revision. Tunnels are not touched.
//   - A broker that refuses the certificate for good (revoked, or replaced since) is not called
//     again: the agent keeps running on its state, tunnels up, and says to join again.

// errConnMoved ends a watch whose connection was replaced by one with a renewed certificate.
var errConnMoved = errors.New("the broker connection moved to the renewed certificate")

// oldConnGrace is how long a replaced connection stays open for the calls in flight on it.
const oldConnGrace = 15 * time.Second

// brokerConn is the agent's connection to the broker as the loops call through it
// (grpc.ClientConnInterface): each call goes over the connection current when it starts, and a
// renewal replaces that connection whole (swap).
type brokerConn struct {
	mu      sync.Mutex
	cc      *grpc.ClientConn
	gen     uint64
	swapped chan struct{} // closed, and replaced, by every swap
}

func newBrokerConn(cc *grpc.ClientConn) *brokerConn {
	return &brokerConn{cc: cc, swapped: make(chan struct{})}
}

// current is the connection of the moment, its generation, and a channel closed when it is
// replaced.
func (c *brokerConn) current() (*grpc.ClientConn, uint64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cc, c.gen, c.swapped
}

// generation is the generation of the current connection.
func (c *brokerConn) generation() uint64 {
	_, gen, _ := c.current()
	return gen
}

// swap makes cc the connection of every call from now on and returns the one it replaces.
func (c *brokerConn) swap(cc *grpc.ClientConn) *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.cc
	c.cc = cc
	c.gen++
	close(c.swapped)
	c.swapped = make(chan struct{})
	return old
}

func (c *brokerConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	cc, _, _ := c.current()
	return cc.Invoke(ctx, method, args, reply, opts...)
}

func (c *brokerConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc, _, _ := c.current()
	return cc.NewStream(ctx, desc, method, opts...)
}

// ResetConnectBackoff makes the current connection retry now.
func (c *brokerConn) ResetConnectBackoff() {
	cc, _, _ := c.current()
	cc.ResetConnectBackoff()
}

// Close closes the current connection.
func (c *brokerConn) Close() error {
	cc, _, _ := c.current()
	return cc.Close()
}

// certState is what the agent knows of its certificate beyond the keyring.
type certState struct {
	bundle    *apiv1.CABundle  // the last CA bundle the broker sent (nil until one came)
	bundleSeq uint64           // counts the bundles the watch delivered
	renewErr  string           // the last renewal's error, until one succeeds
	refused   string           // the broker's words once it refused the certificate for good
	refusedCh chan struct{}    // closed then
	renewNow  syncloop.Trigger // the bundle changed: look again whether a renewal is due
}

// caBundle is the last CA bundle the broker sent, or nil.
func (l *Link) caBundle() *apiv1.CABundle {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.certs.bundle
}

// onCABundle takes the CA bundle of a watch message: a new one replaces ca.crt and the CAs of the
// next handshakes, and the renewal loop looks again whether the certificate must be renewed.
func (l *Link) onCABundle(b *apiv1.CABundle) {
	changed := false
	err := l.keyring.Update(func(id *brokerclient.Identity) (*brokerclient.Identity, error) {
		if bytes.Equal(b.GetPem(), id.CAPEM) {
			return id, nil
		}
		next, err := id.WithCAs(b.GetPem())
		if err != nil {
			return nil, err
		}
		if err := brokerclient.SaveCAs(l.cfg.StateDir, b.GetPem()); err != nil {
			return nil, err
		}
		changed = true
		return next, nil
	})
	if err != nil {
		l.log.Error("ignoring the broker's CA bundle", "err", err)
		return
	}
	if changed {
		cas, _ := brokerclient.ParseCAs(b.GetPem())
		var hashes []string
		for _, c := range cas {
			hashes = append(hashes, jointoken.CAHash(c.Raw))
		}
		l.log.Info("mesh CA bundle updated: the broker is verified with these CAs from now on", "cas", strings.Join(hashes, ","),
			"issuingCA", b.GetIssuingCa(), "file", filepath.Join(l.cfg.StateDir, brokerclient.CAFile))
	}
	l.mu.Lock()
	l.certs.bundle = b
	l.certs.bundleSeq++
	l.mu.Unlock()
	l.certs.renewNow.Fire()
}

// certLoop renews the agent's certificate when it is due (brokerclient.RenewalDue) and moves the
// broker connection to the renewed certificate. It ends with ctx, or when the broker refused the
// certificate for good.
func (l *Link) certLoop(ctx context.Context, client apiv1.AgentClient) {
	bo := l.deps.Backoff()
	var quiet brokerclient.RepeatFilter
	var old []*grpc.ClientConn // replaced connections, closed after oldConnGrace
	var closeOld <-chan time.Time
	defer func() {
		for _, cc := range old {
			_ = cc.Close()
		}
	}()
	for {
		id := l.keyring.Identity()
		at, reason := brokerclient.RenewalDue(id.Leaf, l.caBundle())
		// Look again at least hourly: the wall clock may have been set since.
		t := time.NewTimer(min(max(time.Until(at), 0), time.Hour))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-l.certs.refusedCh:
			t.Stop()
			return
		case <-l.certs.renewNow.C():
			t.Stop()
			continue
		case <-closeOld:
			t.Stop()
			for _, cc := range old {
				_ = cc.Close()
			}
			old, closeOld = nil, nil
			continue
		case <-t.C:
			if time.Now().Before(at) {
				continue
			}
		}
		gen := l.conn.generation()
		next, err := l.renew(ctx, client, id, reason)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			bo.Reset()
			quiet.Reset()
			cc, err := brokerclient.DialKeyring(l.cfg.Broker, l.keyring)
			if err != nil {
				// Cannot happen with an address the config accepted; the old connection goes on.
				l.log.Error("cannot dial the broker with the renewed certificate", "err", err)
				continue
			}
			old = append(old, l.conn.swap(cc))
			closeOld = time.After(oldConnGrace)
			l.log.Info("agent certificate renewed; new broker calls present it", "serial", next.Leaf.SerialNumber.Text(16),
				"previous", id.Leaf.SerialNumber.Text(16), "notAfter", next.Leaf.NotAfter.UTC().Format(time.RFC3339), "reason", reason)
			continue
		}
		if l.refusedForGood(err, gen) {
			return
		}
		l.mu.Lock()
		l.certs.renewErr = err.Error()
		l.mu.Unlock()
		d := bo.Next()
		if status.Code(errors.Unwrap(err)) == codes.Unimplemented {
			d = brokerclient.UnimplementedRetry // a broker older than renewals: ask again once it may be upgraded
		}
		l.log.Log(ctx, brokerclient.WarnLevel(quiet.Repeated(err)), "certificate renewal failed; retrying", "err", err, "reason", reason, "retryIn", d.Round(time.Millisecond).String(),
			"notAfter", id.Leaf.NotAfter.UTC().Format(time.RFC3339))
		if !retry.Sleep(ctx, d) {
			return
		}
	}
}

// renew makes one renewal and installs the new identity. The CAs are those of the answer, unless
// the watch delivered a bundle meanwhile: the watch's is the newer word on the CAs.
func (l *Link) renew(ctx context.Context, client apiv1.AgentClient, id *brokerclient.Identity, reason string) (*brokerclient.Identity, error) {
	l.log.Info("renewing the agent certificate", "reason", reason, "serial", id.Leaf.SerialNumber.Text(16), "notAfter", id.Leaf.NotAfter.UTC().Format(time.RFC3339))
	l.mu.Lock()
	seq := l.certs.bundleSeq
	l.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	next, bundle, err := brokerclient.Renew(cctx, client, id, l.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	err = l.keyring.Update(func(*brokerclient.Identity) (*brokerclient.Identity, error) {
		l.mu.Lock()
		newer := l.certs.bundle
		if l.certs.bundleSeq == seq {
			newer = nil
		}
		l.certs.renewErr = ""
		if newer == nil {
			l.certs.bundle = bundle
		}
		l.mu.Unlock()
		if newer == nil || bytes.Equal(newer.GetPem(), next.CAPEM) {
			return next, nil
		}
		withNewer, err := next.WithCAs(newer.GetPem())
		if err == nil {
			err = brokerclient.SaveCAs(l.cfg.StateDir, newer.GetPem())
		}
		if err != nil {
			l.log.Error("keeping the renewal answer's CA bundle", "err", err)
			return next, nil
		}
		return withNewer, nil
	})
	return l.keyring.Identity(), err
}

// refusedForGood says whether err, from a call made over the connection of generation gen, is
// the broker refusing the current certificate for good; the first time, it records and logs it
// and stops the loops that call the broker (they check certs.refusedCh or this answer). A refusal
// of a replaced certificate (gen is not the current generation) is not: the next call presents
// the renewed one.
func (l *Link) refusedForGood(err error, gen uint64) bool {
	msg, ok := brokerclient.CertificateRefused(err)
	if !ok || gen != l.conn.generation() {
		return false
	}
	l.mu.Lock()
	first := l.certs.refused == ""
	if first {
		l.certs.refused = msg
		close(l.certs.refusedCh)
	}
	l.mu.Unlock()
	if first {
		l.log.Error("THE BROKER REFUSED THIS NODE'S CERTIFICATE FOR GOOD: the agent stops calling the broker and keeps its tunnels on its last state; join again (a new join token in joinTokenFile, remove agent.crt from stateDir, restart)",
			"err", msg, "stateDir", l.cfg.StateDir)
	}
	return true
}

// certificateRefused is the broker's words when it refused the certificate for good, or "".
func (l *Link) certificateRefused() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.certs.refused
}

// refusedSummary is the broker error status gives for a refused certificate.
func refusedSummary(msg string) string {
	if strings.Contains(msg, "revoked") {
		return "certificate revoked: join again (" + msg + ")"
	}
	return "certificate no longer accepted: join again (" + msg + ")"
}

// certStatus fills the certificate fields of the broker status and returns the node's problems
// about its certificate.
func (l *Link) certStatus(b *statusapi.Broker) []statusapi.Problem {
	if l.keyring == nil {
		return nil
	}
	id := l.keyring.Identity()
	notAfter := id.Leaf.NotAfter.UTC()
	b.CertificateNotAfter = &notAfter
	at, _ := brokerclient.RenewalDue(id.Leaf, l.caBundle())
	if at.IsZero() {
		at = time.Now()
	}
	at = at.UTC().Truncate(time.Second)
	b.CertificateRenewAt = &at
	l.mu.Lock()
	refused, renewErr := l.certs.refused, l.certs.renewErr
	l.mu.Unlock()
	var out []statusapi.Problem
	switch {
	case refused != "":
		b.CertificateRefused, b.Connected, b.Error = true, false, refusedSummary(refused)
		out = append(out, statusapi.Problem{Message: "the broker refused this node's certificate for good: " + refused +
			"; the agent no longer calls the broker and keeps its tunnels on its last state. Join again: a new token in joinTokenFile, remove " +
			brokerclient.CertFile + " from " + l.cfg.StateDir + ", restart the agent"})
	case renewErr != "":
		out = append(out, statusapi.Problem{Message: fmt.Sprintf("certificate renewal failing (certificate valid until %s): %s", notAfter.Format(time.RFC3339), renewErr)})
	}
	return out
}

// logCertificate logs the identity the agent starts with.
func (l *Link) logCertificate(id *brokerclient.Identity) {
	at, _ := brokerclient.RenewalDue(id.Leaf, nil)
	l.log.Info("agent certificate", "serial", id.Leaf.SerialNumber.Text(16), "notAfter", id.Leaf.NotAfter.UTC().Format(time.RFC3339),
		"renewAt", at.UTC().Format(time.RFC3339))
}
