package ipsec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Helpers reports charon (cable.HelperReporter): ours, with its process state, or the system
// charon; and whether it answers a vici "version" request within cable.HelperAnswerTimeout. It
// takes no d.mu: a Connect may hold that for up to defaultCallTimeout while it waits on the
// very charon that hangs, and the status must say so at once.
func (d *Driver) Helpers(ctx context.Context) []cable.HelperStatus {
	pid := 0
	if p := d.charon.Load(); p != nil {
		pid = p.PID()
	}
	return []cable.HelperStatus{charonStatus(ctx, pid, d.ViciSocket(), d.dial(d.ViciSocket()))}
}

// charonStatus is what is known of charon pid (0: none of ours) at socket.
func charonStatus(ctx context.Context, pid int, socket string, client viciClient) cable.HelperStatus {
	s := cable.HelperStatus{Name: "charon", PID: pid, Control: socket, State: cable.HelperNotRunning}
	if pid > 0 {
		s.State = procState(pid)
	}
	ctx, cancel := context.WithTimeout(ctx, cable.HelperAnswerTimeout)
	defer cancel()
	if _, err := client.call(ctx, "version", nil); err != nil {
		// The socket's deadline is the context's: either may be seen first.
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("no answer to version within %s: %w", cable.HelperAnswerTimeout, err)
		}
		s.Error = err.Error()
		return s
	}
	s.Answering = true
	if pid == 0 {
		// A charon the driver does not own (a system charon): it answers, so it runs.
		s.State = cable.HelperRunning
	}
	return s
}

// procState is the state of process pid from /proc/PID/stat.
func procState(pid int) cable.HelperState {
	data, err := os.ReadFile(procPath(pid, "stat"))
	if err != nil {
		return cable.HelperNotRunning
	}
	return procStateOf(data)
}

// procStateOf reads the state letter (statFields). Only the letter is needed, so a short stat
// still gives one of the three states.
func procStateOf(stat []byte) cable.HelperState {
	fields, err := statFields(stat)
	if err != nil {
		return cable.HelperNotRunning
	}
	switch st := (procStat{State: fields[0][0]}); {
	case st.State == 'T' || st.State == 't':
		return cable.HelperStopped
	case !st.alive():
		return cable.HelperNotRunning
	}
	return cable.HelperRunning
}

// lockPoll is how often lock tries d.mu again.
const lockPoll = 5 * time.Millisecond

// lock takes d.mu, or gives up when ctx ends. Readers that serve the status (Connections) use
// it: d.mu is held across calls to charon, and a charon that is stopped (SIGSTOP) answers none,
// so a plain Lock would make the status wait as long as such a call may last.
func (d *Driver) lock(ctx context.Context) error {
	for !d.mu.TryLock() {
		t := time.NewTimer(lockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the driver is busy with a charon request that has not returned (is charon stopped or hung?): %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}
