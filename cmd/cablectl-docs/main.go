// Command cablectl-docs writes cablectl's reference, one Markdown file per command, from the
// command tree itself (cobra's doc generator), so that the reference has exactly the commands,
// flags and help the binary has. `make docs` runs it; a test fails when docs/cablectl/ is not what
// it writes.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/cablemesh/cablemesh/cablectl"
)

// envDefaults are the environment variables cablectl reads for flag defaults. The reference shows
// the built-in defaults, whatever the environment of the run that generates it.
var envDefaults = []string{"CABLEMESH_CONFIG", "CABLEMESH_AGENT_SOCKET"}

func main() {
	dir := flag.String("dir", "docs/cablectl", "directory to write the reference into (its *.md files are replaced)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cablectl-docs: unexpected argument %q (only -dir)\n", flag.Arg(0))
		os.Exit(2)
	}
	if err := writeReference(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "cablectl-docs:", err)
		os.Exit(1)
	}
}

// render generates the reference: file name (cablectl_cluster_list.md) to content.
func render() (map[string][]byte, error) {
	for _, k := range envDefaults {
		if err := os.Unsetenv(k); err != nil {
			return nil, fmt.Errorf("unset %s: %w", k, err)
		}
	}
	root := cablectl.NewRoot()
	// Without the date line cobra adds to every page, the output depends on the tree alone.
	disableAutoGenTag(root)
	tmp, err := os.MkdirTemp("", "cablectl-docs-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := doc.GenMarkdownTree(root, tmp); err != nil {
		return nil, fmt.Errorf("generate the reference: %w", err)
	}
	return readMarkdown(tmp)
}

func disableAutoGenTag(c *cobra.Command) {
	c.DisableAutoGenTag = true
	for _, sub := range c.Commands() {
		disableAutoGenTag(sub)
	}
}

// readMarkdown reads the *.md files of dir (file name to content).
func readMarkdown(dir string) (map[string][]byte, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	files := make(map[string][]byte, len(names))
	for _, p := range names {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read the reference: %w", err)
		}
		files[filepath.Base(p)] = b
	}
	return files, nil
}

// writeReference replaces dir's *.md files with the reference: a page of a command that no
// longer exists is removed, so the directory holds exactly the generated pages.
func writeReference(dir string) error {
	files, err := render()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	old, err := readMarkdown(dir)
	if err != nil {
		return err
	}
	for name := range old {
		if _, keep := files[name]; !keep {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("remove the page of a command that is gone: %w", err)
			}
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("write the reference: %w", err)
		}
	}
	return nil
}
