package preflight

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
)

// stateDirFixture is a state directory as a joined agent leaves it: 0700, agent.key 0600, the
// certificates 0644, a driver's directory with its key.
func stateDirFixture(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(filepath.Join(dir, "wireguard"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{
		brokerclient.KeyFile: 0o600, brokerclient.CertFile: 0o644, brokerclient.CAFile: 0o644,
		"broker-state.json": 0o600, "wireguard/private.key": 0o600,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestStateDirPermissions(t *testing.T) {
	me := os.Geteuid()
	tests := []struct {
		name string
		// change alters the fixture; euid is the agent's uid (default: ours).
		change  func(t *testing.T, dir string)
		euid    int
		refused []string // words of the refusal; nil: accepted
		tighten bool     // accepted, and TightenStateDir changes the directory to 0700
	}{
		{name: "a state directory as the agent makes it is accepted", change: func(*testing.T, string) {}},
		{name: "a missing state directory is accepted (created 0700)", change: func(t *testing.T, dir string) { mustRemoveAll(t, dir) }},
		{name: "our own directory at 0777 is tightened, not refused", change: chmod(".", 0o777), tighten: true},
		{name: "our own directory at 0770 is tightened", change: chmod(".", 0o770), tighten: true},
		{name: "a directory readable by others only is left alone", change: chmod(".", 0o755)},
		{name: "a directory writable by others and owned by root is refused to a non-root agent", change: chmod(".", 0o777),
			euid: 4242, refused: []string{"stateDir", "mode 0777", "owned by uid 0", "cannot tighten"}},
		{name: "a directory owned by another user is refused", change: chown(".", 4242), refused: []string{"owned by uid 4242", "stateDir"}},
		{name: "ca.crt writable by others is refused", change: chmod(brokerclient.CAFile, 0o666), refused: []string{"ca.crt", "mode 0666", "replaced"}},
		{name: "agent.crt writable by the group is refused", change: chmod(brokerclient.CertFile, 0o664), refused: []string{"agent.crt", "mode 0664"}},
		{name: "agent.key readable by others is refused", change: chmod(brokerclient.KeyFile, 0o644), refused: []string{"agent.key", "mode 0644", "leaked"}},
		{name: "agent.key owned by another user is refused", change: chown(brokerclient.KeyFile, 4242), refused: []string{"agent.key", "uid 4242"}},
		{name: "a driver's key readable by others is refused", change: chmod("wireguard/private.key", 0o640), refused: []string{"private.key", "mode 0640"}},
		{name: "a driver's directory writable by others is refused", change: chmod("wireguard", 0o777), refused: []string{"wireguard", "mode 0777"}},
		{name: "a certificate readable by others is fine", change: chmod(brokerclient.CAFile, 0o644)},
		{name: "a file root owns is fine for a non-root agent", change: func(*testing.T, string) {}, euid: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if os.Geteuid() != 0 && (tt.euid != 0 || strings.Contains(tt.name, "owned by")) {
				t.Skip("needs root (chown, or files owned by root)")
			}
			euid := me
			if tt.euid != 0 {
				euid = tt.euid
			}
			dir := stateDirFixture(t)
			tt.change(t, dir)
			err := checkStateDirPermissions(dir, euid)
			if tt.refused == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else {
				var fe *FileError
				if !errors.As(err, &fe) || !errors.Is(err, errStateDirMode) {
					t.Fatalf("got %v, want a *FileError for unsafe permissions", err)
				}
				for _, w := range tt.refused {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal %q does not say %q", err, w)
					}
				}
				return
			}
			before, _ := os.Stat(dir)
			warning, err := TightenStateDir(dir, euid)
			if err != nil {
				t.Fatal(err)
			}
			if (warning != "") != tt.tighten {
				t.Fatalf("tighten warning %q, want one: %v", warning, tt.tighten)
			}
			if !tt.tighten {
				if after, _ := os.Stat(dir); before != nil && after.Mode() != before.Mode() {
					t.Errorf("mode changed from %v to %v without a reason", before.Mode(), after.Mode())
				}
				return
			}
			after, err := os.Stat(dir)
			if err != nil || after.Mode().Perm() != 0o700 {
				t.Fatalf("after tightening: %v %v, want 0700", after.Mode(), err)
			}
			if old := fmt.Sprintf("mode %04o", before.Mode().Perm()); !strings.Contains(warning, dir) || !strings.Contains(warning, "tightened to 0700") || !strings.Contains(warning, old) {
				t.Errorf("warning %q does not name the dir, its old mode and what was done", warning)
			}
		})
	}
}

func chmod(rel string, mode os.FileMode) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		t.Helper()
		if err := os.Chmod(filepath.Join(dir, rel), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func chown(rel string, uid int) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		t.Helper()
		if err := os.Chown(filepath.Join(dir, rel), uid, -1); err != nil {
			t.Fatal(err)
		}
	}
}

func mustRemoveAll(t *testing.T, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}
