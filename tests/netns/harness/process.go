package harness

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one long-running binary the harness started, in its own process group so that
// stopping it also stops anything it spawned. Its stdout and stderr go to LogPath.
type Process struct {
	Name    string
	NS      string // network namespace it runs in ("" for the host's)
	Args    []string
	LogPath string

	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	mu      sync.Mutex
	waitErr error
}

// StartProcess starts argv inside namespace ns (via `ip netns exec`), appending its output to
// logPath. It returns once the process is started, not ready.
func StartProcess(name, ns, logPath string, argv ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	full := argv
	if ns != "" {
		full = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	fmt.Fprintf(logf, "=== %s: %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(full, " "))
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, NS: ns, Args: argv, LogPath: logPath, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	// The waiter is owned by the process: it ends when the process does.
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's pid (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Started is when the process was started.
func (p *Process) Started() time.Time { return p.started }

// Exited reports whether the process has ended, and its exit code if so.
func (p *Process) Exited() (bool, int) {
	select {
	case <-p.done:
		return true, p.cmd.ProcessState.ExitCode()
	default:
		return false, 0
	}
}

// Wait waits up to timeout for the process to end by itself and returns its exit code.
func (p *Process) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s (pid %d) still running after %s", p.Name, p.Pid(), timeout)
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs it. It returns the
// exit code, or an error if the process would not die.
func (p *Process) Stop(grace time.Duration) (int, error) {
	if ok, code := p.Exited(); ok {
		return code, nil
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), fmt.Errorf("%s (pid %d) ignored SIGTERM for %s and was killed", p.Name, p.Pid(), grace)
	case <-time.After(10 * time.Second):
		return -1, errors.New(p.Name + " survived SIGKILL")
	}
}

// Log returns everything the process has written so far, without the harness's own
// "=== <time>: <command>" lines (which name paths and would match what tests look for).
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	var keep []string
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasPrefix(l, "=== ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "")
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string { return tail(p.LogPath, n) }

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
