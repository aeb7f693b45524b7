package ipsec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Our charon outlives the agent process: it holds the IKE_SAs, the CHILD_SAs (in the kernel with
// kernel-netlink, in itself with kernel-libipsec), ipsec0, its routes and its rule, and stopping
// it deletes them all. So an agent restart must not stop it (DESIGN.md: an agent restart does not
// flap unchanged tunnels): charon is started detached from the agent, not as its child (no
// parent-death signal, a process group of its own, reparented to init at once), logging to a file
// rather than to a pipe that would break once the agent is gone, with a pid file naming it. The
// next Init adopts it when it is exactly the charon it would start (adopt.go), and supervises it
// by polling /proc, as it is not its child. Close leaves it running; Cleanup stops it.

// charonPaths are the files of our charon, all in StateDir/ipsec.
type charonPaths struct {
	binary  string // the charon executable (the charon setting)
	conf    string // strongswan.conf, absolute: charon's STRONGSWAN_CONF, the mark of ours
	socket  string // the vici socket, absolute
	pidFile string // charon.pid: the pid of the charon running with conf
	logFile string // charon.log: charon's standard output and error
}

// Files under StateDir/ipsec besides strongswan.conf and the vici socket.
const (
	pidFile = "charon.pid"
	logFile = "charon.log"
	// logKeep is the previous log: the one of the charon before a restart, or the log's first
	// maxLogSize bytes when it grew beyond them.
	logKeep = logFile + ".1"
)

// procRef names one process: a pid and the process's start time, so a pid the kernel has reused
// for another process since is not taken for it.
type procRef struct {
	pid   int
	start uint64
}

// charonProcess supervises our charon: started by the driver (launch) or adopted from an earlier
// run. It starts charon again, with backoff, whenever it exits, and then onStart replays the
// connections into it. Its goroutines (the supervisor and the log follower) end with detach;
// charon itself keeps running.
type charonProcess struct {
	charonPaths
	log *slog.Logger
	// onStart runs on the supervisor's goroutine after every restart, once the vici socket
	// answers (not after the first start or an adoption: Init carries on itself).
	onStart func(ctx context.Context)

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	proc    procRef // the running charon; zero while none runs
	since   time.Time
	starts  int
	adopted bool
}

// Supervision: charon is polled every pollEvery. Backoff between restarts doubles from minBackoff
// to maxBackoff, back to minBackoff after a run longer than stableRun.
const (
	pollEvery    = 500 * time.Millisecond
	minBackoff   = 500 * time.Millisecond
	maxBackoff   = 30 * time.Second
	stableRun    = time.Minute
	startTimeout = 20 * time.Second
	stopTimeout  = 10 * time.Second
	// viciProbeTimeout bounds the version request that decides whether a charon is adopted.
	viciProbeTimeout = 5 * time.Second
	// followEvery is how often the log follower looks for new lines; maxLogSize is the size at
	// which it moves charon.log to charon.log.1 (charon logs a few lines per IKE event, so this
	// is weeks of a quiet mesh).
	followEvery = 250 * time.Millisecond
	maxLogSize  = 4 << 20
)

// launchScript runs in a new mount namespace (Go's Unshareflags, made recursively private): it
// mounts a private tmpfs on /run (charon's pid file path, /run/charon.pid, is compiled in, so two
// charons on one host, one per network namespace, would otherwise refuse to start), starts charon
// in the background with its output appended to the log, prints its pid and exits, so charon is
// orphaned at once and reparented to init: no child of the agent. "$0" is the charon path, "$1"
// the log, passed as arguments so they need no quoting.
const launchScript = `mount -t tmpfs -o mode=0755,size=4m tmpfs /run || exit 1
"$0" </dev/null >>"$1" 2>&1 &
echo $!`

// start launches charon and waits (up to ctx) until its vici socket answers, then supervises it
// under life until detach. onStart is not called for this first start.
func (p *charonProcess) start(ctx, life context.Context) error {
	if _, err := p.launch(ctx); err != nil {
		return err
	}
	p.run(life, false)
	return nil
}

// adopt takes over the running charon ref, left by an earlier run, and supervises it under life
// until detach.
func (p *charonProcess) adopt(life context.Context, ref procRef) {
	p.mu.Lock()
	p.proc, p.since, p.adopted = ref, time.Now(), true
	p.mu.Unlock()
	p.log.Info("adopted the running charon", "pid", ref.pid, "conf", p.conf, "log", p.logFile)
	p.run(life, true)
}

// run starts the supervisor and the log follower (from the log's end when adopting: what charon
// logged while no agent ran stays in the file).
func (p *charonProcess) run(life context.Context, adopted bool) {
	ctx, cancel := context.WithCancel(life)
	p.cancel = cancel
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.supervise(ctx)
	}()
	go func() {
		defer p.wg.Done()
		p.follow(ctx, adopted)
	}()
}

// detach ends supervision and log following and waits for both; charon keeps running, with its
// SAs and routes, for the next Init to adopt (or Cleanup to stop).
func (p *charonProcess) detach() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.wg.Wait()
	p.cancel = nil
}

// launch starts one charon and waits for its vici socket. On failure the charon is stopped again,
// unless ctx ended (Close or Cleanup during a restart): then it is left starting, with its pid
// file, for the next Init to adopt or Cleanup to stop.
func (p *charonProcess) launch(ctx context.Context) (procRef, error) {
	_ = os.Remove(p.socket) // a stale socket from a killed charon would fool waitSocket
	if err := rotateLog(p.logFile); err != nil {
		return procRef{}, err
	}
	cmd := exec.Command("/bin/sh", "-c", launchScript, p.binary, p.logFile)
	// A minimal environment: the agent's (which might hold anything) is not passed on.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "STRONGSWAN_CONF=" + p.conf}
	// A process group of its own keeps the agent's terminal and group signals away from charon. Not
	// a session of its own: with sched_autogroup every session is a scheduling group, and charon
	// (kernel-libipsec's datapath) then got far less CPU than iperf3 beside it; the ipsec cable ran at
	// 0.41 of a hand-made charon, and at 1.12 in its caller's session (bench/cables.md).
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = ee.Stderr
		}
		return procRef{}, fmt.Errorf("start charon %s in a new mount namespace: %w: %s", p.binary, err, bytes.TrimSpace(stderr))
	}
	pid := parsePIDFile(out)
	if pid == 0 {
		return procRef{}, fmt.Errorf("start charon %s: the launcher printed %q, not its pid", p.binary, out)
	}
	st, err := readProcStat(pid)
	if err != nil {
		return procRef{}, fmt.Errorf("charon %s pid %d exited at once: %w (log: %s)", p.binary, pid, err, lastLines(p.logFile, 5))
	}
	ref := procRef{pid: pid, start: st.Start}
	if err := writeFileAtomic(p.pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		stopProcs(p.log, []procRef{ref})
		return procRef{}, err
	}
	p.mu.Lock()
	p.proc, p.since, p.adopted = ref, time.Now(), false
	p.starts++
	p.mu.Unlock()
	p.log.Info("charon started", "pid", pid, "conf", p.conf, "log", p.logFile)
	if err := waitSocket(ctx, p.socket, ref, startTimeout); err != nil {
		if ctx.Err() == nil {
			stopProcs(p.log, []procRef{ref})
			_ = os.Remove(p.pidFile)
		}
		p.mu.Lock()
		p.proc = procRef{}
		p.mu.Unlock()
		return procRef{}, fmt.Errorf("charon %s pid %d: %w (log: %s)", p.binary, pid, err, lastLines(p.logFile, 5))
	}
	return ref, nil
}

// rotateLog keeps the log of the charon before as charon.log.1 and starts an empty charon.log,
// private to root like the rest of the directory.
func rotateLog(path string) error {
	if err := os.Rename(path, filepath.Join(filepath.Dir(path), logKeep)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("keep the previous charon log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create the charon log: %w", err)
	}
	return f.Close()
}

// waitSocket polls the vici socket until it accepts a connection, failing early when charon ref
// exits.
func waitSocket(ctx context.Context, path string, ref procRef, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if !running(ref) {
			return fmt.Errorf("exited before its vici socket %s answered", path)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vici socket %s did not answer within %s: %w", path, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// supervise polls charon until ctx ends (then charon keeps running), and starts it again with
// backoff whenever it exited, then lets onStart replay the connections.
func (p *charonProcess) supervise(ctx context.Context) {
	backoff := minBackoff
	for {
		p.mu.Lock()
		ref, since := p.proc, p.since
		p.mu.Unlock()
		if !waitExit(ctx, ref) {
			return
		}
		p.mu.Lock()
		p.proc = procRef{}
		p.mu.Unlock()
		if time.Since(since) > stableRun {
			backoff = minBackoff
		}
		p.log.Warn("charon exited, restarting", "pid", ref.pid, "ran", time.Since(since).Round(time.Second),
			"backoff", backoff, "log", lastLines(p.logFile, 5))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, maxBackoff)
			_, err := p.launch(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			p.log.Error("restart charon", "err", err, "nextBackoff", backoff)
		}
		if p.onStart != nil {
			p.onStart(ctx)
		}
	}
}

// waitExit polls until process ref has exited (true) or ctx ends (false).
func waitExit(ctx context.Context, ref procRef) bool {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for running(ref) {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// follow passes charon's log lines (level 1: no key material) to slog until ctx ends: from the
// log's end when fromEnd (an adopted charon), else from its start. It follows the log across a
// restart (rotateLog puts a new file in place: the old one is read to its end first) and moves
// it to charon.log.1 when it grows beyond maxLogSize.
func (p *charonProcess) follow(ctx context.Context, fromEnd bool) {
	var (
		f       *os.File
		partial []byte
		buf     = make([]byte, 32<<10)
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	emit := func(data []byte) {
		partial = append(partial, data...)
		for {
			i := bytes.IndexByte(partial, '\n')
			if i < 0 {
				break
			}
			p.log.Info("charon", "line", string(partial[:i]))
			partial = partial[i+1:]
		}
		if len(partial) > 64<<10 {
			p.log.Info("charon", "line", string(partial))
			partial = partial[:0]
		}
	}
	drain := func() int64 {
		var off int64
		for {
			n, err := f.Read(buf)
			emit(buf[:n])
			if err != nil || n == 0 {
				break
			}
		}
		off, _ = f.Seek(0, io.SeekCurrent)
		return off
	}
	t := time.NewTicker(followEvery)
	defer t.Stop()
	for {
		if f == nil {
			if nf, err := os.Open(p.logFile); err == nil {
				f = nf
				if fromEnd {
					_, _ = f.Seek(0, io.SeekEnd)
				}
				fromEnd = false
			}
		}
		if f != nil {
			off := drain()
			fi, ferr := f.Stat()
			pi, perr := os.Stat(p.logFile)
			switch {
			case perr == nil && ferr == nil && !os.SameFile(fi, pi):
				// A new charon's log: this one is read to its end; carry on with the new one.
				f.Close()
				f, partial = nil, partial[:0]
				continue
			case ferr == nil && fi.Size() < off:
				// Truncated (by us, below, or by hand): charon appends from the start again.
				_, _ = f.Seek(0, io.SeekStart)
			case off > maxLogSize:
				if err := keepAndTruncate(p.logFile); err != nil {
					p.log.Warn("cannot move the charon log aside", "err", err)
				} else {
					_, _ = f.Seek(0, io.SeekStart)
				}
			}
		}
		select {
		case <-ctx.Done():
			if f != nil {
				drain()
			}
			return
		case <-t.C:
		}
	}
}

// keepAndTruncate copies the log to charon.log.1 and empties it. charon keeps its descriptor,
// opened for appending, so it carries on at the new end; lines it writes between the copy and the
// truncation are lost, a window of microseconds.
func keepAndTruncate(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(filepath.Dir(path), logKeep), data, 0o600); err != nil {
		return err
	}
	return os.Truncate(path, 0)
}

// lastLines is the last n lines of the file at path, joined with " | ", for error messages.
func lastLines(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// PID of the running charon, 0 when none.
func (p *charonProcess) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc.pid
}

// Starts counts the launches of charon, restarts included (not adoptions).
func (p *charonProcess) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Adopted says whether the charon was adopted from an earlier run (until it is restarted).
func (p *charonProcess) Adopted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.adopted
}

// inspectCharon gathers what decideAdoption needs about the charon the pid file names, in its
// order, stopping at the first check that fails (probe, the vici version request, comes last).
// ref names the process found, for adopt.
func inspectCharon(ctx context.Context, paths charonPaths, probe func(context.Context) error) (f charonFound, ref procRef) {
	data, err := os.ReadFile(paths.pidFile)
	if err != nil {
		return f, ref
	}
	if f.PID = parsePIDFile(data); f.PID == 0 {
		return f, ref
	}
	st, err := readProcStat(f.PID)
	if f.Running = err == nil && st.alive(); !f.Running {
		return f, ref
	}
	ref = procRef{pid: f.PID, start: st.Start}
	if f.Conf = procConf(f.PID); f.Conf != paths.conf {
		return f, ref
	}
	f.SameExe = sameFile(procPath(f.PID, "exe"), paths.binary)
	if !f.SameExe {
		return f, ref
	}
	if f.SameNetns = sameFile(procPath(f.PID, "ns/net"), "/proc/self/ns/net"); !f.SameNetns {
		return f, ref
	}
	f.ConfOnDisk, _ = os.ReadFile(paths.conf)
	if f.ConfOnDisk == nil {
		return f, ref
	}
	pctx, cancel := context.WithTimeout(ctx, viciProbeTimeout)
	defer cancel()
	f.Vici = probe(pctx)
	return f, ref
}

func procPath(pid int, name string) string { return "/proc/" + strconv.Itoa(pid) + "/" + name }

// readProcStat reads /proc/PID/stat.
func readProcStat(pid int) (procStat, error) {
	data, err := os.ReadFile(procPath(pid, "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(data)
}

// running says whether process ref still runs: same pid, same start time, not a zombie (a
// charon of ours is no child of this process, so nothing here reaps it).
func running(ref procRef) bool {
	if ref.pid <= 0 {
		return false
	}
	st, err := readProcStat(ref.pid)
	return err == nil && st.alive() && st.Start == ref.start
}

// procConf is the STRONGSWAN_CONF of process pid, "" when unreadable.
func procConf(pid int) string {
	env, err := os.ReadFile(procPath(pid, "environ"))
	if err != nil {
		return ""
	}
	return envValue(env, "STRONGSWAN_CONF")
}

// sameFile says whether paths a and b (followed) are the same file.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// ourCharons finds every running charon of ours: the one the pid file names and any other whose
// STRONGSWAN_CONF is our strongswan.conf (one whose launch was interrupted before its pid file
// was written, or whose pid file was removed by hand). Only processes named like the charon
// binary are looked at beyond the pid file, so other processes' environments are left unread.
func ourCharons(paths charonPaths) []procRef {
	var out []procRef
	add := func(pid int) {
		st, err := readProcStat(pid)
		if err != nil || !st.alive() || procConf(pid) != paths.conf {
			return
		}
		ref := procRef{pid: pid, start: st.Start}
		if !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	if data, err := os.ReadFile(paths.pidFile); err == nil {
		if pid := parsePIDFile(data); pid != 0 {
			add(pid)
		}
	}
	comm := filepath.Base(paths.binary)
	if len(comm) > 15 {
		comm = comm[:15] // the kernel's TASK_COMM_LEN less the NUL
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if c, err := os.ReadFile(procPath(pid, "comm")); err == nil && strings.TrimSpace(string(c)) == comm {
			add(pid)
		}
	}
	return out
}

// stopProcs stops the charons refs with SIGTERM (each deletes its SAs, routes, rule and ipsec0,
// telling its peers), then SIGKILL after stopTimeout, and waits until they are gone.
func stopProcs(log *slog.Logger, refs []procRef) {
	if len(refs) == 0 {
		return
	}
	for _, r := range refs {
		if running(r) {
			_ = syscall.Kill(r.pid, syscall.SIGTERM)
		}
	}
	if waitGone(refs, stopTimeout) {
		log.Info("charon stopped", "pids", pidsOf(refs))
		return
	}
	for _, r := range refs {
		if running(r) {
			log.Warn("charon did not stop after SIGTERM, killing it", "pid", r.pid)
			_ = syscall.Kill(r.pid, syscall.SIGKILL)
		}
	}
	if !waitGone(refs, 5*time.Second) {
		log.Error("charon still runs after SIGKILL", "pids", pidsOf(refs))
	}
}

func waitGone(refs []procRef, within time.Duration) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if !slices.ContainsFunc(refs, running) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func pidsOf(refs []procRef) []int {
	out := make([]int, 0, len(refs))
	for _, r := range refs {
		out = append(out, r.pid)
	}
	return out
}
