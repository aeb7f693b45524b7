package nstest

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Peer is a test program (a driver testpeer) run inside a namespace with `ip netns exec`, which
// writes a JSON status file the test reads. Set the exported fields, then Start it; it can be
// started again after it ended (an agent restart), keeping its log file.
type Peer struct {
	// NS is the namespace the program runs in.
	NS string
	// Args is the command line after `ip`, e.g. netns exec NS BIN FLAGS...
	Args []string
	// StatusPath is the JSON status file it writes (with a "pid" field: the pid it runs as).
	StatusPath string
	// Env is its environment; nil inherits the test's.
	Env []string
	// Stdin, when set, gives what each start reads on standard input.
	Stdin func() io.Reader
	// TermGrace, when set, is how long a test's cleanup waits after SIGTERM before SIGKILL, for
	// programs whose clean exit matters (they stop a daemon of theirs); otherwise it SIGKILLs.
	TermGrace time.Duration
	// StopWithin is how long Stop waits for the exit; 0 means 20s.
	StopWithin time.Duration
	// ExitsWhenDone says the program ends after writing the status a test may be waiting for,
	// so WaitStatus accepts the status it finds after the exit instead of failing.
	ExitsWhenDone bool

	cmd    *exec.Cmd
	exited chan error
}

// LogPath is the file the program's output goes to, next to the status file; every start
// appends to it.
func (p *Peer) LogPath() string { return filepath.Join(filepath.Dir(p.StatusPath), "testpeer.log") }

// Start starts the program and registers its ending with t.Cleanup. The log is shown once, when
// the test failed or runs verbose, after every start's process has ended.
func (p *Peer) Start(t testing.TB) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p.StatusPath), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", p.Args...)
	cmd.Env = p.Env
	logf, err := os.OpenFile(p.LogPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if p.Stdin != nil {
		cmd.Stdin = p.Stdin()
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }() // owned by the process: ends when it does
	if p.cmd == nil {
		t.Cleanup(func() {
			if t.Failed() || testing.Verbose() {
				if data, err := os.ReadFile(p.LogPath()); err == nil {
					t.Logf("%s testpeer log:\n%s", p.NS, data)
				}
			}
		})
	}
	p.cmd, p.exited = cmd, exited
	t.Cleanup(func() { p.end(t, cmd, exited) })
}

// end ends one start's process if it still runs.
func (p *Peer) end(t testing.TB, cmd *exec.Cmd, exited chan error) {
	select {
	case <-exited:
		return
	default:
	}
	if p.TermGrace > 0 {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return
		case <-time.After(p.TermGrace):
		}
	}
	// SIGKILL what `ip netns exec` became. A program that forks (wireguard's RunIsolated) reports
	// its working process's pid in the status: kill that too, in case it was orphaned.
	cmd.Process.Kill()
	if data, err := os.ReadFile(p.StatusPath); err == nil {
		var st struct {
			PID int `json:"pid"`
		}
		if json.Unmarshal(data, &st) == nil && st.PID > 0 && st.PID != cmd.Process.Pid {
			syscall.Kill(st.PID, syscall.SIGKILL)
		}
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Logf("%s: testpeer did not exit", p.NS)
	}
}

// Signal sends s to the program.
func (p *Peer) Signal(t testing.TB, s syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatalf("%s: signal %v: %v", p.NS, s, err)
	}
}

// Stop signals the program and waits for it to exit, which must be a clean one.
func (p *Peer) Stop(t testing.TB, s syscall.Signal) {
	t.Helper()
	within := p.StopWithin
	if within == 0 {
		within = 20 * time.Second
	}
	p.Signal(t, s)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Errorf("%s: testpeer exited with %v after %v", p.NS, err, s)
		}
		p.exited <- err // for the cleanup's check
	case <-time.After(within):
		t.Fatalf("%s: testpeer did not exit after %v", p.NS, s)
	}
}

// ReadStatus reads p's status file into an S.
func ReadStatus[S any](t testing.TB, p *Peer) S {
	t.Helper()
	var st S
	data, err := os.ReadFile(p.StatusPath)
	if err != nil {
		t.Fatalf("%s: read status: %v", p.NS, err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("%s: decode status %s: %v", p.NS, data, err)
	}
	return st
}

// WaitStatus waits until p's status satisfies ok, and fails the test when it does not within
// the limit, or when the program exits first (unless ExitsWhenDone and its last status does).
func WaitStatus[S any](t testing.TB, p *Peer, what string, within time.Duration, ok func(S) bool) S {
	t.Helper()
	read := func(last *S) bool {
		var st S
		data, err := os.ReadFile(p.StatusPath)
		if err != nil || json.Unmarshal(data, &st) != nil {
			return false
		}
		*last = st
		return ok(st)
	}
	deadline := time.Now().Add(within)
	var last S
	for time.Now().Before(deadline) {
		select {
		case err := <-p.exited:
			p.exited <- err
			if p.ExitsWhenDone && read(&last) {
				return last
			}
			t.Fatalf("%s: testpeer exited (%v) while waiting for %s; last status %+v", p.NS, err, what, last)
		default:
		}
		if read(&last) {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: no %s within %s; last status %+v", p.NS, what, within, last)
	return last
}
