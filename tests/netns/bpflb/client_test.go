package bpflb

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The client program: this test binary started again (TestMain sees helperEnv) directly into
// the test's cgroup (clone3 CLONE_INTO_CGROUP: it never runs outside it, so even its first
// connect goes through the hooks), which then enters the client namespace on its locked main
// thread and does one command with plain socket syscalls, reporting JSON lines on stdout.

const (
	helperEnv       = "CM_BPFLB_HELPER"
	helperNetnsEnv  = "CM_BPFLB_NETNS"
	helperCgroupEnv = "CM_BPFLB_CGROUP"
)

// report is what the client prints, one JSON object a line.
type report struct {
	Event   string         `json:"event"`             // connected, data, closed, done
	Replies map[string]int `json:"replies,omitempty"` // backend answers, by backend
	Peers   []string       `json:"peers,omitempty"`   // getpeername, distinct
	Sources []string       `json:"sources,omitempty"` // recvfrom sources, distinct
	Reply   string         `json:"reply,omitempty"`
	Mixed   int            `json:"mixed,omitempty"` // UDP sockets that got answers from more than one backend
	Error   string         `json:"error,omitempty"`
	Errno   int            `json:"errno,omitempty"`
	Micros  int64          `json:"micros,omitempty"`
}

func runHelper(args []string) int {
	runtime.LockOSThread() // every socket is created on this thread, in the client namespace
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(report{Event: "done", Error: err.Error()})
		return 1
	}
	if want := os.Getenv(helperCgroupEnv); want != "" {
		data, err := os.ReadFile("/proc/self/cgroup")
		if err != nil || !strings.Contains(string(data), "0::"+want+"\n") {
			return fail(fmt.Errorf("not in cgroup %s: %s %v", want, data, err))
		}
	}
	ns, err := os.Open(os.Getenv(helperNetnsEnv))
	if err != nil {
		return fail(err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fail(fmt.Errorf("setns: %w", err))
	}
	if len(args) < 2 {
		return fail(fmt.Errorf("usage: command address [count [sockets]]"))
	}
	dst, err := netip.ParseAddrPort(args[1])
	if err != nil {
		return fail(err)
	}
	count := 1
	if len(args) > 2 {
		count, _ = strconv.Atoi(args[2])
	}
	h := helper{dst: dst, out: out}
	switch args[0] {
	case "tcp": // count connections, one answer each
		err = h.tcp(count)
	case "connect-error": // one TCP connect that should fail
		err = h.connectError()
	case "send-error": // one UDP sendto that should fail
		err = h.sendError()
	case "udp": // count sockets, args[3] datagrams each, unconnected
		per := 1
		if len(args) > 3 {
			per, _ = strconv.Atoi(args[3])
		}
		err = h.udp(count, per)
	case "hold-tcp": // one connection, reporting every line until it ends
		err = h.hold(unix.SOCK_STREAM)
	case "hold-udp": // one connected UDP socket, likewise
		err = h.hold(unix.SOCK_DGRAM)
	default:
		err = fmt.Errorf("unknown command %q", args[0])
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

type helper struct {
	dst netip.AddrPort
	out *json.Encoder
}

func (h helper) sockaddr() (int, unix.Sockaddr) {
	if h.dst.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Addr: h.dst.Addr().As4(), Port: int(h.dst.Port())}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Addr: h.dst.Addr().As16(), Port: int(h.dst.Port())}
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprintf("%v", sa)
}

// socket opens a socket with timeouts, so that no call of the client blocks for long unless
// the command means to wait.
func (h helper) socket(typ int, timeout time.Duration) (int, unix.Sockaddr, error) {
	family, sa := h.sockaddr()
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil, err
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	return fd, sa, nil
}

func errnoOf(err error) int {
	var en syscall.Errno
	if errors.As(err, &en) {
		return int(en)
	}
	return 0
}

func distinct(set map[string]bool) []string {
	var out []string
	for s := range set {
		out = append(out, s)
	}
	return out
}

func readLine(fd int) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := unix.Read(fd, b)
		if err != nil {
			return string(line), err
		}
		if n == 0 {
			return string(line), errors.New("EOF")
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
}

func (h helper) tcp(count int) error {
	r := report{Event: "done", Replies: map[string]int{}}
	peers := map[string]bool{}
	for range count {
		fd, sa, err := h.socket(unix.SOCK_STREAM, 5*time.Second)
		if err != nil {
			return err
		}
		if err := unix.Connect(fd, sa); err != nil {
			unix.Close(fd)
			return fmt.Errorf("connect %s: %w", h.dst, err)
		}
		if p, err := unix.Getpeername(fd); err == nil {
			peers[sockaddrString(p)] = true
		}
		line, err := readLine(fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("read from %s: %w", h.dst, err)
		}
		r.Replies[line]++
	}
	r.Peers = distinct(peers)
	return h.out.Encode(r)
}

func (h helper) connectError() error {
	fd, sa, err := h.socket(unix.SOCK_STREAM, 5*time.Second)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	start := time.Now()
	err = unix.Connect(fd, sa)
	r := report{Event: "done", Micros: time.Since(start).Microseconds()}
	if err != nil {
		r.Error, r.Errno = err.Error(), errnoOf(err)
	}
	return h.out.Encode(r)
}

func (h helper) sendError() error {
	fd, sa, err := h.socket(unix.SOCK_DGRAM, 5*time.Second)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	start := time.Now()
	err = unix.Sendto(fd, []byte("ping"), 0, sa)
	r := report{Event: "done", Micros: time.Since(start).Microseconds()}
	if err != nil {
		r.Error, r.Errno = err.Error(), errnoOf(err)
	}
	return h.out.Encode(r)
}

func (h helper) udp(sockets, per int) error {
	r := report{Event: "done", Replies: map[string]int{}}
	sources := map[string]bool{}
	buf := make([]byte, 1500)
	for range sockets {
		fd, sa, err := h.socket(unix.SOCK_DGRAM, 5*time.Second)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for range per {
			if err := unix.Sendto(fd, []byte("ping"), 0, sa); err != nil {
				unix.Close(fd)
				return fmt.Errorf("sendto %s: %w", h.dst, err)
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				unix.Close(fd)
				return fmt.Errorf("recvfrom after sending to %s: %w", h.dst, err)
			}
			r.Replies[string(buf[:n])]++
			seen[string(buf[:n])] = true
			sources[sockaddrString(from)] = true
		}
		if len(seen) > 1 {
			r.Mixed++
		}
		unix.Close(fd)
	}
	r.Sources = distinct(sources)
	return h.out.Encode(r)
}

// hold connects, reports the peer and the first answer, then reports everything that
// arrives until the socket fails or ends.
func (h helper) hold(typ int) error {
	fd, sa, err := h.socket(typ, 60*time.Second)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != nil {
		return fmt.Errorf("connect %s: %w", h.dst, err)
	}
	r := report{Event: "connected"}
	if p, err := unix.Getpeername(fd); err == nil {
		r.Peers = []string{sockaddrString(p)}
	}
	next := func() (string, string, error) {
		if typ == unix.SOCK_STREAM {
			line, err := readLine(fd)
			return line, "", err
		}
		buf := make([]byte, 1500)
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return "", "", err
		}
		return string(buf[:n]), sockaddrString(from), nil
	}
	if typ == unix.SOCK_DGRAM {
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			return fmt.Errorf("send to %s: %w", h.dst, err)
		}
	}
	reply, from, err := next()
	if err != nil {
		return fmt.Errorf("first answer from %s: %w", h.dst, err)
	}
	r.Reply = reply
	if from != "" {
		r.Sources = []string{from}
	}
	if err := h.out.Encode(r); err != nil {
		return err
	}
	for {
		reply, from, err := next()
		if err != nil {
			return h.out.Encode(report{Event: "closed", Error: err.Error(), Errno: errnoOf(err)})
		}
		d := report{Event: "data", Reply: reply}
		if from != "" {
			d.Sources = []string{from}
		}
		if err := h.out.Encode(d); err != nil {
			return err
		}
	}
}

// client is a running client program, seen from the test.
type client struct {
	t       *testing.T
	cmd     *exec.Cmd
	reports chan report
}

// startClient starts the client program in e's client namespace and cgroup.
func startClient(t *testing.T, e *env, args ...string) *client {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperNetnsEnv+"="+filepath.Join("/run/netns", e.clientNS),
		helperCgroupEnv+"="+strings.TrimPrefix(e.cgroup, cgroupRoot))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	cmd.Stderr = testWriter{t}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start client %v: %v", args, err)
	}
	c := &client{t: t, cmd: cmd, reports: make(chan report, 16)}
	go func() { // owned by the process: ends when its stdout closes
		defer close(c.reports)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r report
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				r = report{Event: "garbage", Error: sc.Text()}
			}
			c.reports <- r
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// next waits up to within for the client's next report.
func (c *client) next(within time.Duration) (report, bool) {
	c.t.Helper()
	select {
	case r, ok := <-c.reports:
		return r, ok
	case <-time.After(within):
		return report{}, false
	}
}

// must waits for the next report and fails the test unless it is event without error.
func (c *client) must(event string, within time.Duration) report {
	c.t.Helper()
	r, ok := c.next(within)
	if !ok {
		c.t.Fatalf("client %v: no %s report within %v", c.cmd.Args[1:], event, within)
	}
	if r.Event != event || (r.Error != "" && event != "closed") {
		c.t.Fatalf("client %v: got %+v, want a %s report", c.cmd.Args[1:], r, event)
	}
	return r
}

// run runs a client command to its end and returns its report.
func run(t *testing.T, e *env, args ...string) report {
	t.Helper()
	c := startClient(t, e, args...)
	r, ok := c.next(60 * time.Second)
	if !ok {
		t.Fatalf("client %v: no report", args)
	}
	if r.Event != "done" {
		t.Fatalf("client %v: %+v", args, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { <-ctx.Done(); _ = c.cmd.Process.Kill() }()
	_ = c.cmd.Wait()
	return r
}

// runOK is run that fails the test when the client reports an error.
func runOK(t *testing.T, e *env, args ...string) report {
	t.Helper()
	r := run(t, e, args...)
	if r.Error != "" {
		t.Fatalf("client %v: %s", args, r.Error)
	}
	return r
}
