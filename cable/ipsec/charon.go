package ipsec

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// charonProcess starts and supervises one charon: in a new mount namespace with a private tmpfs
// on /run (charon's pid file path, /run/charon.pid, is compiled in, so two charons on one host,
// one per network namespace, would otherwise refuse to start), with STRONGSWAN_CONF pointing at
// our strongswan.conf. It inherits the agent's network namespace. If charon exits, it is started
// again after a backoff, and onStart replays the connections into the new daemon.
type charonProcess struct {
	binary string
	conf   string // strongswan.conf path
	socket string // vici socket path
	log    *slog.Logger
	// onStart runs on the supervisor's goroutine after every restart, once the vici socket
	// answers (not after the first start: start's caller carries on itself).
	onStart func(ctx context.Context)

	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	pid     int
	starts  int
	lastErr error
}

// Backoff between restarts: doubling from minBackoff to maxBackoff, back to minBackoff after a
// run longer than stableRun.
const (
	minBackoff   = 500 * time.Millisecond
	maxBackoff   = 30 * time.Second
	stableRun    = time.Minute
	startTimeout = 20 * time.Second
	stopTimeout  = 10 * time.Second
)

// start launches charon and waits (up to ctx) until its vici socket answers; the supervisor
// goroutine keeps it running until life is cancelled or stop is called, and stop waits for it.
// onStart is not called for this first start.
func (p *charonProcess) start(ctx, life context.Context) error {
	sctx, cancel := context.WithCancel(life)
	p.cancel = cancel
	p.done = make(chan struct{})
	first := make(chan error, 1)
	go p.supervise(sctx, first)
	var err error
	select {
	case err = <-first:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		<-p.done
		p.cancel = nil
		return err
	}
	return nil
}

// launch starts one charon and waits for its vici socket. It must run on the supervisor's locked
// thread: Pdeathsig fires when the thread that forked charon exits, which for a locked goroutine
// is when supervision ends or the agent dies (even by SIGKILL); charon then gets SIGTERM.
func (p *charonProcess) launch(ctx context.Context) (*exec.Cmd, chan error, error) {
	_ = os.Remove(p.socket) // a stale socket from a killed charon would fool waitSocket
	// sh mounts the tmpfs inside the new mount namespace Go created (and made recursively
	// private) for it, then becomes charon. "$0" is the charon path, passed as an argument so it
	// needs no quoting.
	cmd := exec.Command("/bin/sh", "-c", `mount -t tmpfs -o mode=0755,size=4m tmpfs /run && exec "$0"`, p.binary)
	// A minimal environment: the agent's (which might hold anything) is not passed on.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "STRONGSWAN_CONF=" + p.conf}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS,
		Pdeathsig:    syscall.SIGTERM,
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("charon: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start charon %s in a new mount namespace: %w", p.binary, err)
	}
	p.mu.Lock()
	p.pid = cmd.Process.Pid
	p.starts++
	p.mu.Unlock()
	p.log.Info("charon started", "pid", cmd.Process.Pid, "conf", p.conf)
	exited := make(chan error, 1)
	logged := make(chan struct{})
	go func() {
		// Owned by this charon process: ends when its stderr closes, i.e. when it exits.
		defer close(logged)
		forwardLog(p.log, stderr)
	}()
	go func() {
		// Owned by this charon process: reports its exit once the log is drained.
		<-logged
		exited <- cmd.Wait()
	}()
	if err := waitSocket(ctx, p.socket, exited, startTimeout); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		p.mu.Lock()
		p.pid = 0
		p.mu.Unlock()
		return nil, nil, fmt.Errorf("charon %s: %w", p.binary, err)
	}
	return cmd, exited, nil
}

// forwardLog passes charon's log lines (level 1: no key material) to slog.
func forwardLog(log *slog.Logger, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64*1024)
	for sc.Scan() {
		log.Info("charon", "line", sc.Text())
	}
}

// waitSocket polls the vici socket until it accepts a connection.
func waitSocket(ctx context.Context, path string, exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vici socket %s did not answer within %s: %w", path, timeout, err)
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("exited before its vici socket %s answered: %v", path, werr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// supervise runs charon until ctx is cancelled, restarting it with backoff whenever it exits.
// The result of the first launch goes to first. Its goroutine stays locked to its thread for
// its whole life (see launch).
func (p *charonProcess) supervise(ctx context.Context, first chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, after charon
	defer close(p.done)
	cmd, exited, err := p.launch(ctx)
	first <- err
	if err != nil {
		return
	}
	backoff := minBackoff
	for {
		startedAt := time.Now()
		select {
		case <-ctx.Done():
			p.terminate(cmd, exited)
			return
		case err := <-exited:
			p.mu.Lock()
			p.pid = 0
			p.lastErr = err
			p.mu.Unlock()
			if time.Since(startedAt) > stableRun {
				backoff = minBackoff
			}
			p.log.Warn("charon exited, restarting", "err", err, "backoff", backoff)
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, maxBackoff)
			if cmd, exited, err = p.launch(ctx); err == nil {
				break
			}
			p.log.Error("restart charon", "err", err, "nextBackoff", backoff)
		}
		if p.onStart != nil {
			p.onStart(ctx)
		}
	}
}

// terminate stops charon with SIGTERM (it deletes its SAs, routes, rule and ipsec0), then
// SIGKILL after stopTimeout.
func (p *charonProcess) terminate(cmd *exec.Cmd, exited chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(stopTimeout):
		p.log.Warn("charon did not stop after SIGTERM, killing it", "pid", cmd.Process.Pid)
		_ = cmd.Process.Kill()
		<-exited
	}
	p.mu.Lock()
	p.pid = 0
	p.mu.Unlock()
	p.log.Info("charon stopped")
}

// stop ends supervision and charon; it waits for both.
func (p *charonProcess) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.cancel = nil
}

// PID of the running charon, 0 when none.
func (p *charonProcess) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// Starts counts the launches of charon, restarts included.
func (p *charonProcess) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}
