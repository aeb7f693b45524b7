package ipsec

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// This file holds the pure half of adopting a charon an earlier run of the driver left running
// (an agent restart): what Init found of it, whether to adopt it, and the parsers of what /proc
// and the pid file say. No I/O: charon.go gathers, this decides.

// charonFound is what Init finds of the charon named by the pid file. The checks are gathered in
// the order decideAdoption reads them, and gathering stops at the first that fails: a field after
// it keeps its zero value (in particular the vici socket is asked only when everything else
// allows adoption).
type charonFound struct {
	// PID is the pid the pid file names; 0 when there is no pid file or it holds no pid.
	PID int
	// Running says a process with that pid exists and is not a zombie.
	Running bool
	// Conf is that process's STRONGSWAN_CONF ("" when it has none or its environment cannot be
	// read): the one mark of a charon of ours, since the path is this state directory's.
	Conf string
	// SameExe says its executable is the file the charon setting names (a package upgrade
	// replaces the file: the old daemon then runs a deleted inode).
	SameExe bool
	// SameNetns says it runs in this process's network namespace.
	SameNetns bool
	// ConfOnDisk is strongswan.conf as it is on disk (nil when missing): what that charon read
	// when it started, since the driver writes the file only right before starting one.
	ConfOnDisk []byte
	// Vici is the error of the version request over its vici socket (nil: it answered).
	Vici error
}

// adoption is decideAdoption's verdict.
type adoption struct {
	// Adopt keeps the running charon, its SAs and its routes.
	Adopt bool
	// Stop ends the process found (it is a charon of ours that cannot be adopted) before a new
	// one starts. A process that is not ours (a pid reused since) is never stopped.
	Stop bool
	// Reason says why, for the log.
	Reason string
}

// decideAdoption decides whether Init adopts the charon found, given the path (confPath) and the
// text (conf) of the strongswan.conf this run would write. It adopts only a charon that is
// exactly the one this run would start: ours (its STRONGSWAN_CONF is our path), running the
// configured executable, in this network namespace, started with byte-identical configuration
// (so the same ports, plugins, datapath, vici socket, MTU and MSS), and answering on its vici
// socket. Anything else is replaced, so adoption can never keep a stale configuration alive.
func decideAdoption(f charonFound, confPath string, conf []byte) adoption {
	switch {
	case f.PID == 0:
		return adoption{Reason: "no charon pid file"}
	case !f.Running:
		return adoption{Reason: fmt.Sprintf("charon pid %d from the pid file is not running", f.PID)}
	case f.Conf != confPath:
		return adoption{Reason: fmt.Sprintf("pid %d is not a charon of ours (STRONGSWAN_CONF %q, want %q)", f.PID, f.Conf, confPath)}
	case !f.SameExe:
		return adoption{Stop: true, Reason: fmt.Sprintf("charon pid %d runs another executable than the charon setting names (upgraded?)", f.PID)}
	case !f.SameNetns:
		return adoption{Stop: true, Reason: fmt.Sprintf("charon pid %d runs in another network namespace", f.PID)}
	case f.ConfOnDisk == nil:
		return adoption{Stop: true, Reason: fmt.Sprintf("charon pid %d: its strongswan.conf is gone", f.PID)}
	case !bytes.Equal(f.ConfOnDisk, conf):
		return adoption{Stop: true, Reason: fmt.Sprintf("charon pid %d was started with another strongswan.conf than this run writes (settings, datapath or MTU changed)", f.PID)}
	case f.Vici != nil:
		return adoption{Stop: true, Reason: fmt.Sprintf("charon pid %d does not answer on its vici socket: %v", f.PID, f.Vici)}
	}
	return adoption{Adopt: true, Reason: fmt.Sprintf("charon pid %d runs with this run's configuration and answers", f.PID)}
}

// parsePIDFile reads the pid file: one decimal pid and a newline. Anything else is no pid (0).
func parsePIDFile(data []byte) int {
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// procStat is what the driver reads of /proc/PID/stat.
type procStat struct {
	State byte   // R, S, D, Z, X, ...
	Start uint64 // start time in clock ticks since boot: with the pid, it names one process
}

// statFields splits a /proc/PID/stat line into its fields from field 3 (the one-letter state)
// on. The command name (field 2) is in parentheses and may hold anything, spaces and parentheses
// included, so the fields are counted from its last ')'.
func statFields(data []byte) ([]string, error) {
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("no command name in %q", s)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) == 0 || len(fields[0]) != 1 {
		return nil, fmt.Errorf("no one-letter state after the command name in %q", s)
	}
	return fields, nil
}

// parseProcStat parses /proc/PID/stat.
func parseProcStat(data []byte) (procStat, error) {
	fields, err := statFields(data)
	if err != nil {
		return procStat{}, err
	}
	// fields[0] is field 3 (state); the start time is field 22.
	if len(fields) < 20 {
		return procStat{}, fmt.Errorf("%d fields after the command name, want at least 20", len(fields))
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("start time %q: %w", fields[19], err)
	}
	return procStat{State: fields[0][0], Start: start}, nil
}

// alive says the process the stat describes runs: it is neither a zombie nor dead.
func (s procStat) alive() bool { return s.State != 'Z' && s.State != 'X' && s.State != 'x' }

// envValue returns the value of key in a /proc/PID/environ (NUL-separated KEY=value entries).
func envValue(environ []byte, key string) string {
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if k, v, ok := bytes.Cut(kv, []byte{'='}); ok && string(k) == key {
			return string(v)
		}
	}
	return ""
}
