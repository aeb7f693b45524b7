package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestAgentStateDirPermissions: the agent checks its state directory before it uses the
// identity in it. A joined agent restarted over its own state directory at 0777 tightens it to
// 0700 and says so in a warning, then runs; a ca.crt others can write, an agent.key others can
// read, a ca.crt a local non-root user replaced (the attack: the directory was 0777), and a
// state directory owned by another user each make it exit 2 naming the file and the problem.
func TestAgentStateDirPermissions(t *testing.T) {
	m := harness.New(t)
	east := m.AddCluster("east", "10.1.0.0/16")
	east.StartAgent()
	m.WaitConnected(ConnectTimeout, east)
	if code := east.StopAgent(); code != 0 {
		t.Fatalf("the agent exited %d on SIGTERM", code)
	}
	ca := filepath.Join(east.StateDir, "ca.crt")
	key := filepath.Join(east.StateDir, "agent.key")
	mustChmod := func(path string, mode os.FileMode) {
		t.Helper()
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("our own state directory at 0777 is tightened to 0700, with a warning", func(t *testing.T) {
		mustChmod(east.StateDir, 0o777)
		logBefore := len(east.Agent.Log())
		east.StartAgent()
		defer east.StopAgent()
		err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
			_, err := east.Status()
			if exited, code := east.Agent.Exited(); exited {
				return true, fmt.Sprintf("exited %d", code)
			}
			return err == nil, fmt.Sprint(err)
		})
		if err != nil {
			t.Fatalf("the agent did not come up: %v\n%s", err, east.Agent.LogTail(30))
		}
		if exited, code := east.Agent.Exited(); exited {
			t.Fatalf("the agent exited %d:\n%s", code, east.Agent.LogTail(30))
		}
		log := east.Agent.Log()[logBefore:]
		if l := lineWith(log, "tightened to 0700"); !containsAll(l, "level=WARN", east.StateDir, "0777") {
			t.Errorf("no warning naming the state directory, its mode and the tightening: %q\n%s", l, east.Agent.LogTail(30))
		} else {
			t.Logf("warning: %s", l)
		}
		if fi, err := os.Stat(east.StateDir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("state directory mode %v (%v), want 0700", fi.Mode().Perm(), err)
		}
	})

	refused := func(t *testing.T, words ...string) {
		t.Helper()
		east.StartAgent()
		code, err := east.Agent.Wait(20 * time.Second)
		if err != nil {
			east.StopAgent()
			t.Fatalf("the agent started on an unsafe state directory (want exit 2 naming %q): %v\n%s", words, err, east.Agent.LogTail(20))
		}
		log := east.Agent.Log()
		if l := lineWith(log, "cable-agent:"); code != 2 || !containsAll(l, words...) {
			t.Errorf("exit %d, want 2 with a message naming %q:\n%s", code, words, east.Agent.LogTail(10))
		} else {
			t.Logf("exit %d: %s", code, l)
		}
	}
	t.Run("a ca.crt others can write is refused", func(t *testing.T) {
		mustChmod(ca, 0o666)
		defer mustChmod(ca, 0o644)
		refused(t, "stateDir", ca, "0666")
	})
	t.Run("an agent.key others can read is refused", func(t *testing.T) {
		mustChmod(key, 0o644)
		defer mustChmod(key, 0o600)
		refused(t, "stateDir", key, "0644")
	})
	t.Run("a ca.crt a local user replaced through a 0777 state directory is refused", func(t *testing.T) {
		mustChmod(east.StateDir, 0o777)
		defer mustChmod(east.StateDir, 0o700)
		orig, err := os.ReadFile(ca)
		if err != nil {
			t.Fatal(err)
		}
		// What user nobody (65534) could do: write a file of its own and rename it over ca.crt.
		planted := filepath.Join(east.StateDir, ".planted")
		if err := os.WriteFile(planted, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(planted, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(planted, ca); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := os.Chown(ca, 0, 0); err != nil {
				t.Error(err)
			}
		}()
		refused(t, "stateDir", ca, "uid 65534")
	})
	t.Run("a state directory owned by another user is refused", func(t *testing.T) {
		if err := os.Chown(east.StateDir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := os.Chown(east.StateDir, 0, 0); err != nil {
				t.Error(err)
			}
		}()
		refused(t, "stateDir", east.StateDir, "uid 65534")
	})
	t.Run("with everything put back the agent runs again", func(t *testing.T) {
		logBefore := len(east.Agent.Log())
		east.StartAgent()
		m.WaitConnected(ConnectTimeout, east)
		if exited, code := east.Agent.Exited(); exited {
			t.Fatalf("exited %d", code)
		}
		if log := east.Agent.Log()[logBefore:]; strings.Contains(log, "cable-agent: agent config") || strings.Contains(log, "WRITABLE BY OTHERS") {
			t.Errorf("refused or warned again:\n%s", log)
		}
	})
}
