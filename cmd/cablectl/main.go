// Command cablectl is the operator's tool: admin calls to the broker (with the admin credential
// cable-broker writes to DIR/admin.yaml) and status from the local agent (over its unix socket).
// The commands live in package cablectl. Exit codes: 0 ok, 1 failed, 2 bad usage.
package main

import (
	"fmt"
	"os"

	"github.com/cablemesh/cablemesh/cablectl"
)

func main() {
	err := cablectl.NewRoot().Execute()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "Error:", err)
	os.Exit(cablectl.ExitCode(err))
}
