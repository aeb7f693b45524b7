// Package tooldeps reads scripts/deps.list, the one list of the external programs that the
// demo, the tests, the VM stage, the benchmarks and the scripts run: each program, the Debian
// package that provides it and the stages that need it. scripts/install-deps.sh installs from
// the list, the demo and the netns suite check it up front, and this package's scan test fails
// when the repository runs a program the list does not name.
package tooldeps

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// ListPath is the list's path relative to the repository root.
const ListPath = "scripts/deps.list"

// Stages are the stages a program can be needed by.
var Stages = []string{
	"demo",  // scripts/demo.sh and scripts/demo-down.sh
	"unit",  // go test of the packages outside tests/netns and tests/vm, lint, check-bpf
	"netns", // the end-to-end tests in tests/netns (as root)
	"vm",    // tests/vm and scripts/vm (qemu, the guest's userspace)
	"bench", // make bench*
	"gen",   // make generate
	"image", // make image
	"k8s",   // tests/k8s and make k8s-demo: real Kubernetes clusters on this machine
	"run",   // the binaries themselves at run time (cable-agent starting charon, cablectl diagnose)
}

// Kinds say where a program comes from.
var Kinds = []string{
	"apt",       // install-deps.sh installs its package when it is missing (the default)
	"base",      // in every Debian base system (Priority required or important); still checked
	"toolchain", // not an apt package: the Go toolchain, installed by hand from go.dev
	"optional",  // not packaged in Debian; the tests that use it skip without it, nothing installs it
}

// Program is one entry of the list.
type Program struct {
	// Name is a command looked up on PATH, or an absolute path that must exist (a program outside
	// PATH such as /usr/lib/ipsec/charon, or a plugin or header file a program needs).
	Name string
	// Package is the Debian package that provides it, or "-" for the toolchain and optional kinds.
	Package string
	Stages  []string
	Kind    string
	Line    int // its line in the list
}

// For reports whether the program is needed by stage.
func (p Program) For(stage string) bool { return slices.Contains(p.Stages, stage) }

// Present reports whether the program is on PATH (or, for an absolute path, whether the file exists).
func (p Program) Present() bool {
	if filepath.IsAbs(p.Name) {
		_, err := os.Stat(p.Name)
		return err == nil
	}
	_, err := exec.LookPath(p.Name)
	return err == nil
}

// Parse reads a list: one program a line, "NAME PACKAGE STAGE[,STAGE...] [KIND]", blank lines and
// lines starting with # ignored. Every error names the line and the value.
func Parse(r io.Reader) ([]Program, error) {
	var progs []Program
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", ListPath, n, err)
		}
		if first, dup := seen[p.Name]; dup {
			return nil, fmt.Errorf("%s line %d: program %q is listed again (first on line %d)", ListPath, n, p.Name, first)
		}
		seen[p.Name] = n
		p.Line = n
		progs = append(progs, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", ListPath, err)
	}
	return progs, nil
}

func parseLine(line string) (Program, error) {
	f := strings.Fields(line)
	if len(f) < 3 || len(f) > 4 {
		return Program{}, fmt.Errorf("want NAME PACKAGE STAGES [KIND], got %d fields in %q", len(f), line)
	}
	p := Program{Name: f[0], Package: f[1], Stages: strings.Split(f[2], ","), Kind: "apt"}
	if len(f) == 4 {
		p.Kind = f[3]
	}
	if !validName(p.Name) {
		return Program{}, fmt.Errorf("program name %q: want a command name or an absolute path", p.Name)
	}
	if !slices.Contains(Kinds, p.Kind) {
		return Program{}, fmt.Errorf("kind %q of %s: want one of %s", p.Kind, p.Name, strings.Join(Kinds, ", "))
	}
	noPackage := p.Kind == "toolchain" || p.Kind == "optional"
	if noPackage != (p.Package == "-") {
		return Program{}, fmt.Errorf("package %q of %s: kinds toolchain and optional (only) take \"-\"", p.Package, p.Name)
	}
	if p.Package != "-" && !validName(p.Package) {
		return Program{}, fmt.Errorf("package %q of %s: not a Debian package name", p.Package, p.Name)
	}
	for _, s := range p.Stages {
		if !slices.Contains(Stages, s) {
			return Program{}, fmt.Errorf("stage %q of %s: want one of %s", s, p.Name, strings.Join(Stages, ", "))
		}
	}
	return p, nil
}

// validName accepts a command or package name, or an absolute path of plain characters: the list
// is also read by bash, which must not meet quotes, globs or variables in it.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '/' && (i == 0 || s[0] == '/'):
		case i > 0 && (c == '.' || c == '_' || c == '-' || c == '+'):
		default:
			return false
		}
	}
	return !strings.Contains(s, "..") && !strings.HasSuffix(s, "/")
}

// Load reads the list of the repository at root.
func Load(root string) ([]Program, error) {
	f, err := os.Open(filepath.Join(root, ListPath))
	if err != nil {
		return nil, fmt.Errorf("open the list of external programs: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

// RepoRoot finds the repository root (the directory holding go.mod) from dir upwards.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Missing returns the programs of stage that are not installed; optional ones are never missing.
func Missing(progs []Program, stage string) []Program {
	var missing []Program
	for _, p := range progs {
		if p.For(stage) && p.Kind != "optional" && !p.Present() {
			missing = append(missing, p)
		}
	}
	return missing
}

// Describe names each missing program with its package, and how to install them all.
func Describe(missing []Program, profile string) string {
	var b strings.Builder
	for _, p := range missing {
		if p.Package == "-" {
			fmt.Fprintf(&b, "  %s (%s: not an apt package, install it by hand)\n", p.Name, p.Kind)
		} else {
			fmt.Fprintf(&b, "  %s (package %s)\n", p.Name, p.Package)
		}
	}
	fmt.Fprintf(&b, "install them with: sudo scripts/install-deps.sh %s", profile)
	return b.String()
}

// CheckStage loads the list of the repository around dir and returns an error naming every
// program of stage that is missing, with its package.
func CheckStage(dir, stage, profile string) error {
	root, err := RepoRoot(dir)
	if err != nil {
		return err
	}
	progs, err := Load(root)
	if err != nil {
		return err
	}
	if missing := Missing(progs, stage); len(missing) > 0 {
		return fmt.Errorf("%d program(s) the %s stage runs are missing:\n%s", len(missing), stage, Describe(missing, profile))
	}
	return nil
}
