package cablectl

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// finishTree completes the command tree once every command is added: `completion
// bash|zsh|fish|powershell` (cobra's generators, so the scripts know every command and flag),
// completion of -o's values, and exit code 2 for an unknown subcommand of a group (`cablectl
// cluster bogus`), which cobra would otherwise answer with the group's help and 0.
func finishTree(root *cobra.Command) {
	root.AddCommand(newCompletionCmd(root))
	// -o is checked for every command before it does anything, also those that print only a
	// line: a bad value is bad usage (exit 2), never ignored. Commands narrow it further
	// (checkOutput: wide is status's alone).
	if root.PersistentPreRunE == nil {
		root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flag("output")
			if f == nil {
				return nil
			}
			switch f.Value.String() {
			case "table", "wide", "json", "yaml":
				return nil
			}
			return usagef("--output %q: want table, json or yaml", f.Value.String())
		}
	}
	_ = root.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"table", "json", "yaml", "wide"}, cobra.ShellCompDirectiveNoFileComp
	})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && c.HasSubCommands() && !c.Runnable() {
			c.RunE = groupRunE
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// groupRunE runs a command group itself: with no argument it prints the group's help (exit 0, as
// kubectl does), with one it is an unknown subcommand (exit 2).
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
	}
	return cmd.Help()
}

// newCompletionCmd replaces cobra's default completion command, which binds its output to the
// writer of the moment it is created (os.Stdout here) rather than the command's at run time.
func newCompletionCmd(root *cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "completion",
		Short: "Print a shell completion script: bash, zsh, fish or powershell",
		Long: "completion prints a script that completes cablectl's commands, flags and -o values in your shell.\n" +
			"  bash:  source <(cablectl completion bash)      (needs bash-completion)\n" +
			"  zsh:   cablectl completion zsh > \"${fpath[1]}/_cablectl\"\n" +
			"  fish:  cablectl completion fish > ~/.config/fish/completions/cablectl.fish",
	}
	for _, sh := range []struct {
		name string
		gen  func(w io.Writer) error
	}{
		{"bash", func(w io.Writer) error { return root.GenBashCompletionV2(w, true) }},
		{"zsh", root.GenZshCompletion},
		{"fish", func(w io.Writer) error { return root.GenFishCompletion(w, true) }},
		{"powershell", root.GenPowerShellCompletionWithDesc},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:   sh.name,
			Short: "Print the completion script for " + sh.name,
			Args:  cobra.NoArgs,
			RunE:  func(c *cobra.Command, _ []string) error { return sh.gen(c.OutOrStdout()) },
		})
	}
	return cmd
}

// printResult prints what a command did: the line for a person (-o table), or data for -o
// json|yaml.
func printResult(w io.Writer, format, line string, data any) error {
	if format == "table" || format == "wide" {
		_, err := fmt.Fprintln(w, line)
		return err
	}
	return printData(w, format, data)
}
