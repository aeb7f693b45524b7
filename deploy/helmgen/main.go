// Command helmgen writes the Helm chart that package deploy generates from the embedded
// templates (deploy.HelmChart) into a directory, replacing what the chart had there:
//
//	go run ./helmgen helm/cablemesh   (go generate ./deploy)
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/cablemesh/cablemesh/deploy"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: helmgen DIR")
		os.Exit(2)
	}
	if err := write(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "helmgen:", err)
		os.Exit(1)
	}
}

// write replaces the chart's generated directories (templates, crds) and files in dir.
func write(dir string) error {
	files, err := deploy.HelmChart()
	if err != nil {
		return err
	}
	for _, sub := range []string{"templates", "crds"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}
