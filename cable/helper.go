package cable

import (
	"context"
	"time"
)

// HelperReporter is implemented by drivers that depend on a helper daemon outside the agent's
// process (ipsec: strongSwan's charon). The agent's status and `cablectl diagnose` show what
// Helpers reports without knowing the daemon: a tunnel whose daemon is stopped (SIGSTOP) or
// hangs looks alive to every other check.
type HelperReporter interface {
	// Helpers reports each helper daemon as the driver finds it now. It must return within
	// about HelperAnswerTimeout whatever the driver is busy with: it must not wait for the
	// driver's own lock (held across long calls to a daemon that may be the one that hangs).
	Helpers(ctx context.Context) []HelperStatus
}

// HelperAnswerTimeout bounds the request that shows a helper daemon answers. A stopped daemon
// still accepts connections (the kernel queues them) but never answers: without a bound the
// status would hang with it.
const HelperAnswerTimeout = time.Second

// HelperState is a helper daemon's process state.
type HelperState string

const (
	HelperRunning HelperState = "running"
	// HelperStopped is a process stopped by a signal (SIGSTOP, a debugger): alive, doing nothing.
	HelperStopped    HelperState = "stopped"
	HelperNotRunning HelperState = "not running"
)

// HelperStatus is one helper daemon.
type HelperStatus struct {
	Name string
	// PID is 0 when the driver knows no process of its own (it uses a system daemon).
	PID   int
	State HelperState
	// Control is the daemon's control socket; Answering says it answered a request just now,
	// Error why not.
	Control   string
	Answering bool
	Error     string
}
