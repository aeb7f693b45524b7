// Command pause is the pod sandbox ("infra") container of the test clusters: it holds the pod's
// namespaces open and, as PID 1 of a pod sharing its PID namespace, reaps orphaned children. It
// does what upstream's build/pause/linux/pause.c does, in Go so that it builds with the rest of
// the module, statically and offline.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (cablemesh tests/k8s)")
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: shutting down, got signal %v\n", sig)
			os.Exit(0)
		}
		reapChildren()
	}
}

// reapChildren waits for every child that has exited; one SIGCHLD may stand for several.
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
