package shape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// configImport is the agent's config package: Config is the whole file, Static and Live its two
// parts (a component is built with a Static and handed a Live when it changes).
const configImport = "github.com/cablemesh/cablemesh/agent/config"

// wholeConfigOwners are the agent packages that may hold a whole config.Config: the package that
// defines, decodes and diffs it, and the reloader, which keeps the config in force and hands out
// its live part.
var wholeConfigOwners = []string{"agent/config", "agent/reload"}

// wholeConfigNames are config's exported names that are, or return, a whole Config: every
// exported function whose results name Config, and the type itself.
func wholeConfigNames(t *testing.T, root string) []string {
	t.Helper()
	names := []string{"Config"}
	for _, f := range parseDir(t, root, "agent/config") {
		for _, d := range f.file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.Results == nil {
				continue
			}
			for _, r := range fn.Type.Results.List {
				if mentionsIdent(r.Type, "Config") {
					names = append(names, fn.Name.Name)
				}
			}
		}
	}
	if len(names) < 4 {
		t.Fatalf("found only %v in agent/config; Load, Parse and ParseFile return a Config", names)
	}
	return names
}

type parsedFile struct {
	path string
	file *ast.File
	fset *token.FileSet
}

// parseDir parses the non-test Go files of one directory.
func parseDir(t *testing.T, root, dir string) []parsedFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []parsedFile
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, parsedFile{path: rel, file: f, fset: fset})
	}
	return out
}

func mentionsIdent(n ast.Node, name string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			found = true
		}
		return !found
	})
	return found
}

// configName is the name f imports the config package under ("" when it does not).
func configName(t *testing.T, f parsedFile) string {
	t.Helper()
	for _, imp := range f.file.Imports {
		if strings.Trim(imp.Path.Value, `"`) != configImport {
			continue
		}
		if imp.Name == nil {
			return "config"
		}
		if imp.Name.Name == "." {
			t.Errorf("%s dot-imports %s: name it, so that what it uses from it can be checked", f.path, configImport)
		}
		return imp.Name.Name
	}
	return ""
}

// wholeConfigUses are f's references to a whole config (config.Config, config.Load, ...),
// each with the function it sits in ("" outside any).
func wholeConfigUses(t *testing.T, f parsedFile, forbidden []string) (uses []string, funcs []string) {
	t.Helper()
	pkg := configName(t, f)
	if pkg == "" || pkg == "_" {
		return nil, nil
	}
	for _, d := range f.file.Decls {
		fn := ""
		if fd, ok := d.(*ast.FuncDecl); ok {
			fn = fd.Name.Name
		}
		ast.Inspect(d, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == pkg && slices.Contains(forbidden, sel.Sel.Name) {
				uses = append(uses, f.fset.Position(sel.Pos()).String()+": "+pkg+"."+sel.Sel.Name)
				funcs = append(funcs, fn)
			}
			return true
		})
	}
	return uses, funcs
}

// agentPackages are the directories below agent/ that hold non-test Go files.
func agentPackages(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(root, "agent"), func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "agent" {
			return nil
		}
		files, _ := filepath.Glob(filepath.Join(p, "*.go"))
		if slices.ContainsFunc(files, func(f string) bool { return !strings.HasSuffix(f, "_test.go") }) {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A component is built with the config's Static part and handed its Live part when it changes:
// none can read a live field (joinTokenFile, healthCheck, dns.upstream, exports, ...) from the
// config it started with, which a reload leaves stale, because none holds a whole Config.
func TestNoComponentHoldsTheWholeConfig(t *testing.T) {
	root := repoRoot(t)
	forbidden := wholeConfigNames(t, root)
	pkgs := agentPackages(t, root)
	for _, want := range []string{"agent/brokerlink", "agent/cables", "agent/exports", "agent/ingress", "agent/servicedp"} {
		if !slices.Contains(pkgs, want) {
			t.Fatalf("%s not among the agent's packages %v", want, pkgs)
		}
	}
	for _, pkg := range pkgs {
		if pkg == "agent/reload" {
			checkHandsOutNoWholeConfig(t, root, pkg)
		}
		if slices.Contains(wholeConfigOwners, pkg) {
			continue
		}
		for _, f := range parseDir(t, root, pkg) {
			uses, _ := wholeConfigUses(t, f, forbidden)
			for _, u := range uses {
				t.Errorf("%s: %s is a component: take config.Static at New and config.Live on change (Deps.Live, ApplyConfig), not the whole config", u, pkg)
			}
		}
	}
}

// checkHandsOutNoWholeConfig fails when an exported function or method of pkg returns a whole
// config: a component could then get one without naming its type.
func checkHandsOutNoWholeConfig(t *testing.T, root, pkg string) {
	t.Helper()
	for _, f := range parseDir(t, root, pkg) {
		for _, d := range f.file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if ok && fn.Name.IsExported() && fn.Type.Results != nil && mentionsIdent(fn.Type.Results, "Config") {
				t.Errorf("%s: %s.%s returns a whole config; hand out its Live part", f.fset.Position(fn.Pos()), pkg, fn.Name.Name)
			}
		}
	}
}

// The agent's wiring splits the config it is given in New and keeps only the parts: the Agent
// holds no whole Config, and nothing but New reads Options.Config (New clears it).
func TestTheAgentKeepsOnlyTheConfigsParts(t *testing.T) {
	root := repoRoot(t)
	forbidden := wholeConfigNames(t, root)
	for _, f := range parseDir(t, root, "agent") {
		uses, funcs := wholeConfigUses(t, f, forbidden)
		for i, u := range uses {
			if funcs[i] != "" && funcs[i] != "New" {
				t.Errorf("%s in %s: only New may see the whole config; read a.cfg (static) or a.liveConfig()", u, funcs[i])
			}
		}
		ast.Inspect(f.file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeSpec:
				if n.Name.Name == "Agent" && mentionsIdent(n.Type, "Config") {
					t.Errorf("%s: the Agent struct holds a whole config.Config", f.fset.Position(n.Pos()))
				}
			case *ast.FuncDecl:
				if n.Name.Name != "New" && n.Body != nil && readsOptionsConfig(n.Body) {
					t.Errorf("%s: %s reads Options.Config; only New may (it splits and clears it)", f.fset.Position(n.Pos()), n.Name.Name)
				}
			}
			return true
		})
	}
}

// readsOptionsConfig reports whether body selects .Config on opts or on a.opts.
func readsOptionsConfig(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Config" {
			return true
		}
		switch x := sel.X.(type) {
		case *ast.Ident:
			found = found || x.Name == "opts"
		case *ast.SelectorExpr:
			found = found || x.Sel.Name == "opts"
		}
		return true
	})
	return found
}
