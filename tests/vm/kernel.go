// Package vm boots a stock Debian kernel under qemu with this machine's own userspace (the
// host's / read-only over 9p under a tmpfs overlay, in the manner of virtme) and runs a chosen
// set of the netns tests inside it, with the same binaries, on kernel datapaths the host kernel
// lacks (WireGuard, ESP). The guest's PID 1 is tests/vm/guestinit; the contract between the two
// is tests/vm/guest. TestKernelDatapathsInVM is the entry point; `make vm-test` runs it.
//
// The guest kernel comes from Debian's linux-image-amd64, unpacked (not installed: nothing of the
// host's boot changes) by scripts/vm/install-kernel.sh under KernelDirDefault/<release>/, with
// boot/vmlinuz-<release> and lib/modules/<release> (depmod run).
package vm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// KernelDirDefault is where scripts/vm/install-kernel.sh unpacks guest kernels; KernelDirEnv
// names another directory of the same layout.
const (
	KernelDirDefault = "/var/lib/cablemesh/vm-kernel"
	KernelDirEnv     = "CABLEMESH_VM_KERNEL_DIR"
)

// Kernel is one unpacked guest kernel.
type Kernel struct {
	Release string // e.g. 6.1.0-56-amd64
	Tree    string // holds boot/ and lib/modules/<Release>
	Image   string // the bzImage
}

// ModulesDir is lib/modules/<release> of the kernel.
func (k Kernel) ModulesDir() string { return filepath.Join(k.Tree, "lib", "modules", k.Release) }

// FindKernel returns the newest kernel unpacked under dir (each in dir/<release>/, with
// boot/vmlinuz-<release> and lib/modules/<release>/modules.dep).
func FindKernel(dir string) (Kernel, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Kernel{}, fmt.Errorf("guest kernels in %s: %w (scripts/vm/install-kernel.sh puts them there)", dir, err)
	}
	var found []Kernel
	var problems []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		k := Kernel{Release: e.Name(), Tree: filepath.Join(dir, e.Name())}
		k.Image = filepath.Join(k.Tree, "boot", "vmlinuz-"+k.Release)
		if _, err := os.Stat(k.Image); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if _, err := os.Stat(filepath.Join(k.ModulesDir(), "modules.dep")); err != nil {
			problems = append(problems, err.Error()+" (depmod not run)")
			continue
		}
		found = append(found, k)
	}
	if len(found) == 0 {
		return Kernel{}, fmt.Errorf("no guest kernel under %s (run scripts/vm/install-kernel.sh)%s", dir, joinProblems(problems))
	}
	slices.SortFunc(found, func(a, b Kernel) int { return compareReleases(a.Release, b.Release) })
	return found[len(found)-1], nil
}

func joinProblems(p []string) string {
	if len(p) == 0 {
		return ""
	}
	return ": " + strings.Join(p, "; ")
}

// compareReleases orders kernel releases by their numeric fields ("6.1.0-56-amd64" before
// "6.1.0-101-amd64"), falling back to the strings.
func compareReleases(a, b string) int {
	fa, fb := releaseFields(a), releaseFields(b)
	for i := 0; i < len(fa) && i < len(fb); i++ {
		if fa[i] != fb[i] {
			return fa[i] - fb[i]
		}
	}
	if len(fa) != len(fb) {
		return len(fa) - len(fb)
	}
	return strings.Compare(a, b)
}

func releaseFields(r string) []int {
	var out []int
	for _, f := range strings.FieldsFunc(r, func(c rune) bool { return c < '0' || c > '9' }) {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

// ModuleDeps is modules.dep: a module's path (relative to lib/modules/<release>) to the paths
// of every module it needs.
type ModuleDeps map[string][]string

// ParseModulesDep reads modules.dep ("kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko ...").
func ParseModulesDep(text string) (ModuleDeps, error) {
	deps := ModuleDeps{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: no ':' in %q", n, line)
		}
		deps[mod] = strings.Fields(rest)
	}
	return deps, sc.Err()
}

// ModuleName is the name a module goes by (modprobe's): file name without .ko[.xz|.zst|.gz],
// '-' read as '_'.
func ModuleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// LoadOrder returns the module paths to load, dependencies first, each once, for names.
func (d ModuleDeps) LoadOrder(names ...string) ([]string, error) {
	byName := map[string]string{}
	for p := range d {
		byName[ModuleName(p)] = p
	}
	var order []string
	seen := map[string]bool{}
	var visit func(p string, stack []string) error
	visit = func(p string, stack []string) error {
		if seen[p] {
			return nil
		}
		if slices.Contains(stack, p) {
			return fmt.Errorf("modules.dep has a cycle: %s", strings.Join(append(stack, p), " -> "))
		}
		deps, ok := d[p]
		if !ok {
			return fmt.Errorf("modules.dep names %s but has no line for it", p)
		}
		for _, dep := range deps {
			if err := visit(dep, append(stack, p)); err != nil {
				return err
			}
		}
		seen[p] = true
		order = append(order, p)
		return nil
	}
	for _, n := range names {
		p, ok := byName[ModuleName(n)]
		if !ok {
			return nil, fmt.Errorf("module %s: %w", n, errNoModule)
		}
		if err := visit(p, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

var errNoModule = errors.New("not in modules.dep (built in, or not built at all)")
