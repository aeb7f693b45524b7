package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs main itself when the test binary is started as cablectl by TestExitCodes.
func TestMain(m *testing.M) {
	if os.Getenv("CABLECTL_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestExitCodes: the process exits 0 on success, 2 on bad usage and 1 on any other failure,
// printing "Error: " and the error on stderr for both.
func TestExitCodes(t *testing.T) {
	noAgent := filepath.Join(t.TempDir(), "no-agent.sock")
	for _, tc := range []struct {
		args      []string
		code      int
		stderrHas string
		stdoutHas string
	}{
		{[]string{"completion", "bash"}, 0, "", "cablectl"},
		{[]string{"cluster", "bogus"}, 2, `Error: unknown command "bogus" for "cablectl cluster"`, ""},
		{[]string{"status", "-o", "xml"}, 2, `Error: --output "xml"`, ""},
		{[]string{"status"}, 1, "Error: ", ""},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), "CABLECTL_TEST_RUN_MAIN=1", "CABLEMESH_AGENT_SOCKET="+noAgent)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("cablectl %v: %v", tc.args, err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.stderrHas) || !strings.Contains(stdout.String(), tc.stdoutHas) {
			t.Errorf("cablectl %v: exit %d, want %d; stderr %q (want %q); stdout has %q: %v",
				tc.args, code, tc.code, stderr.String(), tc.stderrHas, tc.stdoutHas, strings.Contains(stdout.String(), tc.stdoutHas))
		}
		if tc.code == 0 && stderr.Len() != 0 {
			t.Errorf("cablectl %v: exit 0 with stderr %q", tc.args, stderr.String())
		}
	}
}
