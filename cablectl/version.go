package cablectl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/cablemesh/cablemesh/internal/version"
)

// versionInfo is `cablectl version -o json|yaml`.
type versionInfo struct {
	Client string `json:"client"`
	// Agent and Broker are empty when unknown; AgentError says why the agent could not be asked.
	Agent      string `json:"agent,omitempty"`
	AgentError string `json:"agentError,omitempty"`
	Broker     string `json:"broker,omitempty"`
	// BrokerAddress is the broker the agent talks to.
	BrokerAddress string `json:"brokerAddress,omitempty"`
}

func newVersionCmd(g *globalFlags) *cobra.Command {
	var socket string
	var timeout time.Duration
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the versions of cablectl, the local agent and the broker it talks to",
		Long: "version prints cablectl's build, then asks the local cable-agent (over --socket) for its own and for the\n" +
			"broker's, which the broker sends with every register and heartbeat reply (a non-gateway agent does\n" +
			"not heartbeat: its broker version is unknown). Exit code 1 when the agent cannot be asked; --client\n" +
			"prints cablectl's alone.",
		Example: "  cablectl version\n  cablectl version --client\n  cablectl version -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(g.output); err != nil {
				return err
			}
			v := versionInfo{Client: version.String()}
			var agentErr error
			if !clientOnly {
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				s, err := fetchStatus(ctx, socket)
				if err != nil {
					agentErr = err
					v.AgentError = agentErr.Error()
				} else {
					v.Agent, v.Broker, v.BrokerAddress = s.Version, s.Broker.Version, s.Broker.Address
				}
			}
			if err := printVersion(cmd.OutOrStdout(), g.output, v, clientOnly); err != nil {
				return err
			}
			return agentErr
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultStatusSocket(), "the agent's status socket (its statusSocket setting); env CABLEMESH_AGENT_SOCKET")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the agent")
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print cablectl's version only; do not ask the agent")
	return cmd
}

func printVersion(w io.Writer, format string, v versionInfo, clientOnly bool) error {
	if format != "table" {
		return printData(w, format, v)
	}
	fmt.Fprintf(w, "Client: %s\n", v.Client)
	if clientOnly {
		return nil
	}
	agent := v.Agent
	switch {
	case v.AgentError != "":
		agent = "unknown (agent not reachable)"
	case agent == "":
		agent = "unknown (the agent does not report it)"
	}
	broker := v.Broker
	switch {
	case v.AgentError != "":
		broker = "unknown (agent not reachable)"
	case broker == "":
		broker = "unknown (no register or heartbeat reply yet)"
	}
	if v.BrokerAddress != "" {
		broker += " at " + v.BrokerAddress
	}
	fmt.Fprintf(w, "Agent:  %s\n", agent)
	_, err := fmt.Fprintf(w, "Broker: %s\n", broker)
	return err
}
