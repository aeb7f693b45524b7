package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// charonDriver is what the ipsec driver tells of its charon (cable/ipsec.Driver).
type charonDriver interface {
	CharonPID() int
	ViciSocket() string
}

// daemonAnswerTimeout bounds the request that shows the daemon answers: a stopped (SIGSTOP)
// charon accepts the connection in the kernel's backlog but never answers.
const daemonAnswerTimeout = time.Second

// charonStatus is what the status says of charon: its process state from /proc (pid 0: the
// driver knows none, e.g. a system charon) and whether it answers a vici "version" request.
func charonStatus(ctx context.Context, pid int, socket string) *statusapi.Daemon {
	d := &statusapi.Daemon{Name: "charon", PID: pid, Control: socket, State: "not running"}
	if pid > 0 {
		d.State = procState(pid)
	}
	if err := viciVersion(ctx, socket, daemonAnswerTimeout); err != nil {
		d.Error = err.Error()
	} else {
		d.Answering = true
		if pid == 0 {
			// A charon the driver does not own (system charon): it answers, so it runs.
			d.State = "running"
		}
	}
	return d
}

// procState is running, stopped or "not running" from the state letter of /proc/PID/stat.
func procState(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "not running"
	}
	return procStateOf(data)
}

// procStateOf reads the state letter after the command name, which ends at the last ')'.
func procStateOf(stat []byte) string {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return "not running"
	}
	switch stat[i+2] {
	case 'T', 't':
		return "stopped"
	case 'Z', 'X', 'x':
		return "not running"
	}
	return "running"
}

// viciVersion sends vici's "version" command and waits for its answer. The protocol (strongSwan's
// src/libcharon/plugins/vici/README.md): each packet is a 32-bit big-endian length, then a type
// byte; a CMD_REQUEST (0) carries the command's name as a length byte and the name, then an empty
// message; the answer is a CMD_RESPONSE (1), or CMD_UNKNOWN (2).
func viciVersion(ctx context.Context, socket string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("vici socket %s: %w", socket, err)
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	const cmd = "version"
	req := []byte{0, 0, 0, byte(2 + len(cmd)), 0, byte(len(cmd))}
	req = append(req, cmd...)
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("vici socket %s: send version: %w", socket, err)
	}
	var hdr [5]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("vici socket %s: no answer to version within %s: %w", socket, timeout, err)
	}
	if n := binary.BigEndian.Uint32(hdr[:4]); n == 0 || hdr[4] != 1 {
		return fmt.Errorf("vici socket %s: answered packet type %d to version, want a response (1)", socket, hdr[4])
	}
	return nil
}
