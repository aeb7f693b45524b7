package agent

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
)

// TestAJoinTokenFileOthersCanReadIsWarnedAbout: a token file readable by
// group or others is a warning in the log and a problem in the status, and once the node joined
// the log says the file can be deleted.
func TestAJoinTokenFileOthersCanReadIsWarnedAbout(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	if err := os.Chmod(cfg.JoinTokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	startAgentWith(t, cfg, fakedriver.New(), func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	eventually(t, "the agent joined", func() bool {
		_, err := brokerclient.LoadIdentity(cfg.StateDir)
		return err == nil
	})
	eventually(t, "the log warns about the token file and says it can be deleted", func() bool {
		l := logs.String()
		return lineWith(l, "level=WARN", cfg.JoinTokenFile, "readable by others") != "" && lineWith(l, cfg.JoinTokenFile, "can be deleted") != ""
	})
	_, m := getStatus(t, cfg.StatusSocket)
	problems, _ := m["problems"].([]any)
	found := false
	for _, p := range problems {
		msg, _ := p.(map[string]any)["message"].(string)
		found = found || (strings.Contains(msg, cfg.JoinTokenFile) && strings.Contains(msg, "0644"))
	}
	if !found {
		t.Errorf("status problems %v do not name the token file %s and its mode", m["problems"], cfg.JoinTokenFile)
	}
	t.Logf("warning: %s", lineWith(logs.String(), "readable by others"))
	t.Logf("after the join: %s", lineWith(logs.String(), "can be deleted"))
}

// TestATokenFileOnlyTheAgentCanReadIsNotWarnedAbout: 0600 is quiet.
func TestATokenFileOnlyTheAgentCanReadIsNotWarnedAbout(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	logs := &syncbuf.Buffer{}
	startAgentWith(t, cfg, fakedriver.New(), func(o *Options) { o.Log = slog.New(slog.NewTextHandler(logs, nil)) })
	eventually(t, "the agent joined and says the token can be deleted", func() bool { return lineWith(logs.String(), "can be deleted") != "" })
	if l := lineWith(logs.String(), "readable by others"); l != "" {
		t.Errorf("a 0600 token file was warned about: %s", l)
	}
	if _, m := getStatus(t, cfg.StatusSocket); m["problems"] != nil {
		t.Errorf("status problems = %v, want none", m["problems"])
	}
}

// TestATokenAlreadyUsedEndsRunWithTheBrokersWords (defect 1): the broker's refusal reaches the
// operator verbatim (cmd/cable-agent prints Run's error on stderr and exits 1).
func TestATokenAlreadyUsedEndsRunWithTheBrokersWords(t *testing.T) {
	b := newBroker(t)
	const msg = `join token already used: it joined node "east-gw9" of cluster "east" and serves at most 1 distinct node(s); create a new token`
	b.RefuseJoins(status.Error(codes.Unauthenticated, msg))
	cfg := testConfig(t, b, true)
	r := startAgent(t, cfg, fakedriver.New(), nil)
	var err error
	select {
	case err = <-r.done:
		r.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("the agent kept running after the broker refused its token")
	}
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Fatalf("Run = %v, want the broker's words %q", err, msg)
	}
	t.Logf("Run: %v", err)
}

// lineWith is the first line of log holding every one of subs, or "".
func lineWith(log string, subs ...string) string {
	for _, l := range strings.Split(log, "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return l
		}
	}
	return ""
}
