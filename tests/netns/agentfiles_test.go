package netns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestAgentJoinTokenFileAndStateDir, with the real
// binaries: a join token file others can read is a warning in the log and a problem in the
// status, and the agent says after its join that the file can be deleted; a second node with the
// same token exits 1 with the broker's "join token already used" verbatim on stderr; a stateDir
// that is a file, and a missing token file on first start, exit 2 naming the field and the path.
func TestAgentJoinTokenFileAndStateDir(t *testing.T) {
	m := harness.New(t)
	east := m.AddCluster("east", "10.1.0.0/16")
	if err := os.Chmod(east.TokenPath, 0o644); err != nil {
		t.Fatal(err)
	}
	east.StartAgent()
	m.WaitConnected(ConnectTimeout, east)

	t.Run("a token file others can read is warned about, and may be deleted after the join", func(t *testing.T) {
		log := east.Agent.Log()
		if l := lineWith(log, "readable by others"); !containsAll(l, "level=WARN", east.TokenPath, "0644") {
			t.Errorf("no warning naming the token file and its mode: %q\n%s", l, east.Agent.LogTail(30))
		} else {
			t.Logf("warning: %s", l)
		}
		if l := lineWith(log, "can be deleted"); !strings.Contains(l, east.TokenPath) {
			t.Errorf("the log does not say the token file can be deleted: %q", l)
		} else {
			t.Logf("after the join: %s", l)
		}
		st, err := east.Status()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range st.Problems {
			found = found || (p.Cluster == "" && containsAll(p.Message, east.TokenPath, "readable by others"))
		}
		if !found {
			t.Errorf("status problems %+v do not name the token file", st.Problems)
		}
		if table := east.StatusTable(); !strings.Contains(table, "readable by others") {
			t.Errorf("cablectl status does not show the problem:\n%s", table)
		}
	})

	// A second node of east, in namespaces of its own.
	second := m.NewCluster("second", "10.9.0.0/16")
	second.Name, second.PodCIDR, second.Node = "east", east.PodCIDR, "east-gw2"
	token, err := os.ReadFile(east.TokenPath)
	if err != nil {
		t.Fatal(err)
	}
	exits := func(t *testing.T, want int, words ...string) string {
		t.Helper()
		second.StartAgent()
		code, err := second.Agent.Wait(30 * time.Second)
		if err != nil {
			second.StopAgent()
			t.Fatalf("%v\n%s", err, second.Agent.Log())
		}
		log := second.Agent.Log()
		if code != want || !containsAll(log, words...) {
			t.Errorf("exit code %d, want %d; stderr should name %q:\n%s", code, want, words, log)
		}
		t.Logf("exit %d: %s", code, lineWith(log, "cable-agent:"))
		return log
	}

	t.Run("a second node with the same token exits 1 with the broker's words", func(t *testing.T) {
		second.WriteToken(strings.TrimSpace(string(token)))
		second.WriteConfig("")
		exits(t, 1, "cable-agent: cannot join the mesh: broker refused to join: join token already used")
	})
	t.Run("a stateDir that is a file exits 2 naming it", func(t *testing.T) {
		file := filepath.Join(second.Dir, "not-a-dir")
		if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		second.WriteConfig("")
		cfg := strings.Replace(second.ConfigYAML(""), "stateDir: "+second.StateDir, "stateDir: "+file, 1)
		if err := os.WriteFile(second.ConfigPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		exits(t, 2, "stateDir: "+file, "not a directory")
	})
	t.Run("a missing token file on first start exits 2 naming it", func(t *testing.T) {
		if err := os.Remove(second.TokenPath); err != nil {
			t.Fatal(err)
		}
		second.WriteConfig("")
		exits(t, 2, "joinTokenFile: "+second.TokenPath, "no such file")
		if _, err := os.Stat(second.StateDir); err == nil {
			t.Errorf("the agent created its state dir %s", second.StateDir)
		}
	})
}
