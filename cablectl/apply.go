package cablectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cablemesh/cablemesh/api/limits"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

// resourceName is how apply and delete name a policy in their output, as kubectl does.
func resourceName(name string) string { return "clusterconnectionpolicy/" + name }

// maxPolicyFile bounds what apply reads from one file or stdin.
const maxPolicyFile = 16 << 20

func newApplyCmd(g *globalFlags) *cobra.Command {
	var (
		files  []string
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE [-f FILE]...",
		Short: "Create or update ClusterConnectionPolicies from YAML (multi-document; \"-\" reads stdin)",
		Long: `Applies every ClusterConnectionPolicy in the files (YAML, multi-document, or JSON; a directory
means its *.yaml, *.yml and *.json files): policies written for Submariner's connection-policy proposal apply as written, with kind
ClusterConnectionPolicy or ClusterConnectionPolicies. All of them are applied at once or none
is: a file with one invalid policy changes nothing. Prints, per policy,
clusterconnectionpolicy/NAME created, configured or unchanged.`,
		Example: "  cablectl apply -f policies.yaml\n  cablectl connection-policy export | cablectl apply -f -",
		Args:    exactArgs(0, ""),
	}
	fa := newAdminFlags(g, cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		policies, err := readPolicyFiles(cmd, files)
		if err != nil {
			return err
		}
		return applyPolicies(cmd, fa, policies, dryRun)
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `file or directory of policies; "-" reads stdin (repeatable)`)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "have the broker validate and report without storing")
	return cmd
}

func newDeleteCmd(g *globalFlags) *cobra.Command {
	var (
		files          []string
		ignoreNotFound bool
	)
	cmd := &cobra.Command{
		Use:   "delete -f FILE [-f FILE]...",
		Short: "Delete the ClusterConnectionPolicies named in YAML files (\"-\" reads stdin)",
		Long: `Deletes every policy named in the files (the same files apply -f reads), all or none: if
one does not exist nothing is deleted, unless --ignore-not-found. The mesh default policy
cannot be deleted. Prints clusterconnectionpolicy/NAME deleted per policy.`,
		Args: exactArgs(0, ""),
	}
	fa := newAdminFlags(g, cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		policies, err := readPolicyFiles(cmd, files)
		if err != nil {
			return err
		}
		names := make([]string, len(policies))
		for i, p := range policies {
			names[i] = p.Metadata.Name
		}
		return deletePolicies(cmd, fa, names, ignoreNotFound)
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `file or directory of policies; "-" reads stdin (repeatable)`)
	cmd.Flags().BoolVar(&ignoreNotFound, "ignore-not-found", false, "delete those that exist and skip the others")
	return cmd
}

// readPolicyFiles reads and decodes every policy in files. Warnings (lines the decoder had to
// re-indent, a common slip in hand-written YAML) go to stderr. Names must be unique across files.
func readPolicyFiles(cmd *cobra.Command, files []string) ([]policy.ClusterConnectionPolicy, error) {
	if len(files) == 0 {
		return nil, usagef("%s needs -f FILE (a file, a directory, or - for stdin)", cmd.CommandPath())
	}
	if n := countOf(files, "-"); n > 1 {
		return nil, usagef("-f - (stdin) is given %d times; it can be read once", n)
	}
	var (
		out   []policy.ClusterConnectionPolicy
		from  = map[string]string{}
		paths []string
	)
	for _, f := range files {
		if f == "-" {
			paths = append(paths, f)
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, errors.Unwrap(err))
		}
		if !st.IsDir() {
			paths = append(paths, f)
			continue
		}
		entries, err := os.ReadDir(f)
		if err != nil {
			return nil, fmt.Errorf("read directory %s: %w", f, err)
		}
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					paths = append(paths, filepath.Join(f, e.Name()))
				}
			}
		}
	}
	for _, path := range paths {
		data, err := readLimited(cmd, path)
		if err != nil {
			return nil, err
		}
		name := path
		if path == "-" {
			name = "stdin"
		}
		ps, warnings, err := policy.DecodeYAMLWithWarnings(data)
		for _, w := range warnings {
			fmt.Fprintf(cmd.ErrOrStderr(), "Warning: %s: %s\n", name, w)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for _, p := range ps {
			if other, dup := from[p.Metadata.Name]; dup {
				return nil, fmt.Errorf("%s: policy %q is also in %s", name, p.Metadata.Name, other)
			}
			from[p.Metadata.Name] = name
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policies in %s", strings.Join(files, ", "))
	}
	return out, nil
}

func countOf(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

func readLimited(cmd *cobra.Command, path string) ([]byte, error) {
	var r io.Reader
	if path == "-" {
		r = cmd.InOrStdin()
	} else {
		fh, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, errors.Unwrap(err))
		}
		defer fh.Close()
		r = fh
	}
	data, err := io.ReadAll(io.LimitReader(r, maxPolicyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxPolicyFile {
		return nil, fmt.Errorf("read %s: larger than %d MiB", path, maxPolicyFile>>20)
	}
	return data, nil
}

// applyPolicies sends policies to the broker in one all-or-nothing call and prints one line per
// policy, in the order given.
func applyPolicies(cmd *cobra.Command, f *adminFlags, policies []policy.ClusterConnectionPolicy, dryRun bool) error {
	req := &apiv1.ApplyPoliciesRequest{DryRun: dryRun}
	for i := range policies {
		b, err := policy.EncodeJSON(&policies[i])
		if err != nil {
			return fmt.Errorf("encode policy %q: %w", policies[i].Metadata.Name, err)
		}
		req.Policies = append(req.Policies, &apiv1.Policy{Name: policies[i].Metadata.Name, Json: b})
	}
	if err := checkApplyBounds(policies, req.Policies); err != nil {
		return err
	}
	var resp *apiv1.ApplyPoliciesResponse
	err := f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
		var err error
		if resp, err = client.ApplyPolicies(ctx, req); err != nil {
			return rpcError("apply", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(resp.Outcomes) != len(resp.Policies) {
		return fmt.Errorf("apply: the broker answered %d outcomes for %d policies", len(resp.Outcomes), len(resp.Policies))
	}
	suffix := ""
	if dryRun {
		suffix = " (dry run)"
	}
	for i, p := range resp.Policies {
		if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s%s\n", resourceName(p.Name), resp.Outcomes[i], suffix); err != nil {
			return err
		}
	}
	return nil
}

// checkApplyBounds refuses, before anything is sent, an apply the broker would refuse for its
// size (the API's bounds, api/limits), naming the policy, the field and the limit: a request
// larger than the broker's message limit would otherwise come back as a bare transport error.
func checkApplyBounds(policies []policy.ClusterConnectionPolicy, enc []*apiv1.Policy) error {
	if n := len(enc); n > limits.MaxPoliciesPerApply {
		return fmt.Errorf("apply: %d policies at once, at most %d: apply them in several parts (nothing applied)", n, limits.MaxPoliciesPerApply)
	}
	var problems []string
	total := 0
	for i, p := range enc {
		total += len(p.Json)
		if n := len(p.Json); n > limits.MaxPolicyJSONBytes {
			problems = append(problems, fmt.Sprintf("policy %q: the policy is %d bytes of JSON, at most %d", p.Name, n, limits.MaxPolicyJSONBytes))
		}
		for _, e := range limits.PolicyBounds(policies[i]) {
			problems = append(problems, fmt.Sprintf("policy %q: %s", p.Name, e))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("apply: nothing applied: %s", strings.Join(problems, "; "))
	}
	if total > limits.MaxApplyBytes {
		return fmt.Errorf("apply: %d bytes of policies at once, at most %d: apply them in several parts (nothing applied)", total, limits.MaxApplyBytes)
	}
	return nil
}

// deletePolicies deletes names in one all-or-nothing call. With ignoreNotFound it first drops the
// names the broker does not have (a policy deleted by someone else in between still fails).
func deletePolicies(cmd *cobra.Command, f *adminFlags, names []string, ignoreNotFound bool) error {
	var deleted []string
	err := f.withBroker(cmd, func(ctx context.Context, client apiv1.AdminClient) error {
		if ignoreNotFound {
			list, err := client.ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
			if err != nil {
				return rpcError("delete", err)
			}
			have := map[string]bool{}
			for _, p := range list.Policies {
				have[p.Name] = true
			}
			names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !have[n] })
			if len(names) == 0 {
				return nil
			}
		}
		resp, err := client.DeletePolicies(ctx, &apiv1.DeletePoliciesRequest{Names: names})
		if err != nil {
			return rpcError("delete", err)
		}
		deleted = resp.Deleted
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range deleted {
		if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s deleted\n", resourceName(n)); err != nil {
			return err
		}
	}
	return nil
}
