// Package cablectl holds the commands of cablectl, the operator's tool: admin calls to the broker
// (with the admin credential cable-broker writes to DIR/admin.yaml) and status from the local agent
// (over its unix socket). cmd/cablectl builds the root command, runs it and exits with ExitCode:
// 0 ok, 1 failed, 2 bad usage.
package cablectl

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// usageError marks an error caused by how cablectl was called (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// globalFlags are shared by every subcommand.
type globalFlags struct {
	config string // path to an admin.yaml
	output string // table | json | yaml
}

// NewRoot builds cablectl's whole command tree; every call returns a new, independent tree.
func NewRoot() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "cablectl",
		Short:         "Operate a Cablemesh mesh: clusters, join tokens, status",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.config, "config", defaultAdminConfig(), "admin credential file written by cable-broker (DIR/admin.yaml); env CABLEMESH_CONFIG")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table | json | yaml (status also: wide)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	svc := newServiceCmd(g)         // service.go: list, describe (broker)
	addServiceAgentCommands(svc, g) // service_agent.go: export, unexport (local agent)
	root.AddCommand(newClusterCmd(g), newStatusCmd(g), newConnectionPolicyCmd(g), newApplyCmd(g), newDeleteCmd(g), svc)
	root.AddCommand(newCertCmd(g), newAdminCmd(g), newCACmd(g)) // certs.go
	root.AddCommand(newInstallCmd(g), newUninstallCmd(g))       // install.go
	root.AddCommand(newLinksCmd(g), newDiagnoseCmd(g), newVersionCmd(g))
	root.AddCommand(newDashboardCmd(g))
	finishTree(root) // commands.go: completion, exit 2 for unknown subcommands; keep it last
	return root
}

func defaultAdminConfig() string {
	if p := os.Getenv("CABLEMESH_CONFIG"); p != "" {
		return p
	}
	return "/var/lib/cablemesh/broker/admin.yaml"
}

// ExitCode is the process exit code for what NewRoot().Execute returned: 0 for no error, 2 for
// bad usage, 1 for any other failure.
func ExitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue) || isCobraUsageError(err):
		return 2
	}
	return 1
}
