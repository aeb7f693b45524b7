package harness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// CmdTimeout bounds every short command the harness runs (ip, cablectl, ping).
const CmdTimeout = 60 * time.Second

// Result is the outcome of one finished command.
type Result struct {
	Args     []string
	Stdout   string
	Stderr   string
	ExitCode int
	Err      error // nil when the command ran and exited 0
}

func (r Result) String() string {
	return fmt.Sprintf("%s: exit %d: stdout %q stderr %q", strings.Join(r.Args, " "), r.ExitCode, r.Stdout, r.Stderr)
}

// Run runs a command to completion (bounded by CmdTimeout) and returns what it printed.
func Run(ctx context.Context, name string, args ...string) Result {
	return RunTimeout(ctx, CmdTimeout, name, args...)
}

// RunTimeout is Run with its own bound.
func RunTimeout(ctx context.Context, timeout time.Duration, name string, args ...string) Result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := Result{Args: append([]string{name}, args...), Stdout: stdout.String(), Stderr: stderr.String(), Err: err}
	if ee, ok := err.(*exec.ExitError); ok {
		r.ExitCode = ee.ExitCode()
	} else if err != nil {
		r.ExitCode = -1
	}
	return r
}

// MustRun runs a command and returns an error carrying its output when it fails.
func MustRun(ctx context.Context, name string, args ...string) (string, error) {
	r := Run(ctx, name, args...)
	if r.Err != nil {
		return r.Stdout, fmt.Errorf("%s", r)
	}
	return r.Stdout, nil
}

// NSRun runs a command inside network namespace ns.
func NSRun(ctx context.Context, ns string, name string, args ...string) Result {
	return Run(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}
