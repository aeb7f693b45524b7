package brokerclient

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/internal/testbroker"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// startBroker runs the real broker with the clusters east and west.
func startBroker(t *testing.T) *testbroker.Broker {
	t.Helper()
	b := testbroker.New(t, testbroker.Options{})
	if err := b.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	b.UpsertCluster(&apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}})
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}})
	return b
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestJoinPersistsAnIdentityThatDialsWithMTLS(t *testing.T) {
	b := startBroker(t)
	state := filepath.Join(t.TempDir(), "state")
	if _, err := LoadIdentity(state); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("LoadIdentity before join = %v", err)
	}
	id, _, err := Join(context.Background(), JoinParams{Broker: b.Addr(), Cluster: "east", Node: "e1", TokenFile: writeToken(t, b.Token("east", time.Hour)), StateDir: state})
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if id.Leaf.Subject.CommonName != "e1" {
		t.Errorf("certificate CN %q", id.Leaf.Subject.CommonName)
	}
	fi, err := os.Stat(filepath.Join(state, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("agent.key: %v %v", fi, err)
	}
	loaded, err := LoadIdentity(state)
	if err != nil {
		t.Fatalf("LoadIdentity after join: %v", err)
	}
	conn, err := Dial(b.Addr(), loaded)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The broker knows the caller by its certificate: an unregistered endpoint is NotFound, not
	// Unauthenticated, which proves the client certificate was presented and accepted.
	_, err = apiv1.NewAgentClient(conn).Heartbeat(ctx, &apiv1.HeartbeatRequest{Node: "e1"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("Heartbeat over mTLS = %v, want NotFound", err)
	}
}

func TestJoinFailuresWriteNothing(t *testing.T) {
	b := startBroker(t)
	other := startBroker(t)
	tests := []struct {
		name      string
		token     string
		cluster   string
		permanent bool
		want      string
	}{
		{"an expired token is refused with the broker's words", b.Token("east", -time.Minute), "east", true, "join token has expired"},
		{"a token from another broker's CA fails the pin", other.Token("east", time.Hour), "east", true, "pinned hash"},
		{"a token for another cluster is refused before dialling", b.Token("west", time.Hour), "east", true, `token is for cluster "west"`},
		{"a malformed token is refused before dialling", "cmj1.garbage", "east", true, "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			_, _, err := Join(context.Background(), JoinParams{Broker: b.Addr(), Cluster: tt.cluster, Node: "e1", TokenFile: writeToken(t, tt.token), StateDir: state})
			if err == nil {
				t.Fatal("Join succeeded")
			}
			if Permanent(err) != tt.permanent || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v (permanent %v), want %q", err, Permanent(err), tt.want)
			}
			if _, serr := os.Stat(state); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("state dir was created: %v", serr)
			}
		})
	}
}

func TestJoinToAnUnreachableBrokerIsRetryable(t *testing.T) {
	b := startBroker(t)
	tok := writeToken(t, b.Token("east", time.Hour))
	b.Stop()
	_, _, err := Join(context.Background(), JoinParams{Broker: b.Addr(), Cluster: "east", Node: "e1", TokenFile: tok, StateDir: t.TempDir(), Timeout: 2 * time.Second})
	if err == nil || Permanent(err) {
		t.Fatalf("Join to a stopped broker = %v, want a retryable error", err)
	}
}
