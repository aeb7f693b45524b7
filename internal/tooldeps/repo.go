package tooldeps

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Use is one place in the repository that runs a program.
type Use struct {
	Program string
	File    string // relative to the repository root, with slashes
	Line    int
	Stage   string // the stage the file belongs to (StageOf), "" when none in particular
}

// RepoScan is what ScanRepo found.
type RepoScan struct {
	Uses     []Use
	Indirect []Use // Program holds the enclosing function and the expression
}

// StageOf says which stage runs what a file of the repository runs, by its path: the list must
// name the program for that stage. "" means the file runs in several stages (a script's
// helpers, the Go toolchain's CI entry point): the list must name the program, for any stage.
func StageOf(file string) string {
	switch {
	case strings.HasPrefix(file, "tests/netns/"):
		return "netns"
	case strings.HasPrefix(file, "tests/vm/"), strings.HasPrefix(file, "scripts/vm/"):
		return "vm"
	case strings.HasPrefix(file, "bench/"), strings.HasPrefix(file, "internal/benchresults/"):
		return "bench"
	case file == "scripts/demo.sh", file == "scripts/demo-down.sh":
		return "demo"
	case strings.HasPrefix(file, "tests/k8s/"), strings.HasPrefix(file, "scripts/k8s-"), file == "tests/helm/build.sh":
		return "k8s"
	case file == "scripts/image.sh":
		return "image"
	case strings.HasSuffix(file, "_test.go"), strings.HasSuffix(path.Dir(file), "test"):
		return "unit" // tests, and the helpers of tests (broker/store/etcdtest)
	case strings.HasSuffix(file, ".go") && !strings.HasPrefix(file, "internal/tooldeps/"):
		return "run"
	}
	return ""
}

// ScanRepo scans every Go file and shell script of the repository at root (not testdata, not
// hidden directories other than .ci).
func ScanRepo(root string) (RepoScan, error) {
	var goFiles, shFiles []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(name, ".") && rel != ".ci" || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(name, ".go"):
			goFiles = append(goFiles, rel)
		case strings.HasSuffix(name, ".sh") || isShellScript(p):
			shFiles = append(shFiles, rel)
		}
		return nil
	})
	if err != nil {
		return RepoScan{}, fmt.Errorf("walk %s: %w", root, err)
	}

	var scan RepoScan
	consts, err := packageConsts(root, goFiles)
	if err != nil {
		return RepoScan{}, err
	}
	bins := ProjectBinaries(root)
	for _, rel := range goFiles {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return RepoScan{}, err
		}
		g, err := ScanGo(rel, src, consts[path.Dir(rel)], bins)
		if err != nil {
			return RepoScan{}, fmt.Errorf("parse %s: %w", rel, err)
		}
		for _, f := range g.Found {
			scan.Uses = append(scan.Uses, Use{Program: f.Program, File: rel, Line: f.Line, Stage: StageOf(rel)})
		}
		for _, in := range g.Indirect {
			scan.Indirect = append(scan.Indirect, Use{Program: in.Func + ": " + in.Expr, File: rel, Line: in.Line})
		}
	}
	for _, rel := range shFiles {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return RepoScan{}, err
		}
		for _, f := range ScanShell(string(src)) {
			scan.Uses = append(scan.Uses, Use{Program: f.Program, File: rel, Line: f.Line, Stage: StageOf(rel)})
		}
	}
	return scan, nil
}

// ProjectBinaries are the names of the programs the project builds: the directories under cmd/
// and tests/netns/cmd/.
func ProjectBinaries(root string) map[string]bool {
	bins := map[string]bool{}
	for _, dir := range []string{"cmd", "tests/netns/cmd"} {
		entries, _ := os.ReadDir(filepath.Join(root, dir))
		for _, e := range entries {
			if e.IsDir() {
				bins[e.Name()] = true
			}
		}
	}
	return bins
}

// packageConsts gathers the string constants of each directory's Go files (a package and its tests).
func packageConsts(root string, goFiles []string) (map[string]map[string]string, error) {
	consts := map[string]map[string]string{}
	for _, rel := range goFiles {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		dir := path.Dir(rel)
		if consts[dir] == nil {
			consts[dir] = map[string]string{}
		}
		for k, v := range StringConsts(rel, src) {
			consts[dir][k] = v
		}
	}
	return consts, nil
}

// isShellScript reports whether a file without the .sh suffix starts with a sh or bash #! line.
func isShellScript(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 64)
	n, _ := f.Read(head)
	first, _, _ := strings.Cut(string(head[:n]), "\n")
	return strings.HasPrefix(first, "#!") && (strings.HasSuffix(first, "sh") || strings.HasSuffix(first, "bash"))
}
