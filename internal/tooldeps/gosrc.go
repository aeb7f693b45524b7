package tooldeps

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
)

// Runner is a function that runs a program named by one of its arguments: exec.Command and the
// test harnesses' helpers around it.
type Runner struct {
	Pkg  string // the package's name (as imported: exec, harness, nstest)
	Func string // the function's or method's name
	Arg  int    // the argument that names the program; the command's arguments follow it
	// Each says every argument from Arg on is a program (nstest.RequireRoot's tools).
	Each bool
}

// Runners are the functions the scan follows. A program named by a literal (or a constant) at
// Arg is a program the repository runs. A new function that calls exec.Command with a program
// it was handed must be added here, or the scan reports it (see Indirect).
var Runners = []Runner{
	{Pkg: "exec", Func: "Command", Arg: 0},
	{Pkg: "exec", Func: "CommandContext", Arg: 1},
	{Pkg: "exec", Func: "LookPath", Arg: 0},
	{Pkg: "os", Func: "StartProcess", Arg: 0},
	{Pkg: "harness", Func: "Run", Arg: 1},
	{Pkg: "harness", Func: "RunTimeout", Arg: 2},
	{Pkg: "harness", Func: "MustRun", Arg: 1},
	{Pkg: "harness", Func: "NSRun", Arg: 2},
	{Pkg: "harness", Func: "StartProcess", Arg: 3},
	{Pkg: "nstest", Func: "Run", Arg: 0},
	{Pkg: "nstest", Func: "RunWithin", Arg: 1},
	{Pkg: "nstest", Func: "MustRun", Arg: 1},
	{Pkg: "nstest", Func: "RequireRoot", Arg: 2, Each: true},
	{Pkg: "benchresults", Func: "FirstLine", Arg: 0},
	{Pkg: "ingressbench", Func: "run", Arg: 0},
	{Pkg: "ingressbench", Func: "startServer", Arg: 2},
	{Pkg: "health", Func: "output", Arg: 2},
	{Pkg: "health", Func: "start", Arg: 4},
	{Pkg: "mss_test", Func: "run", Arg: 1},
}

// Indirect is a call of exec.Command (or os.StartProcess) whose program is not a literal, in a
// function that is neither a Runner nor allowed to: the scan cannot see what it runs.
type Indirect struct {
	Line int
	Func string // the enclosing function
	Expr string // the program argument as written
}

// GoFile is what ScanGo found in one Go file.
type GoFile struct {
	Pkg      string
	Found    []Found
	Indirect []Indirect
}

// unknownArg marks an argument the scan cannot read (the rest of a variadic slice, a variable).
var unknownArg ast.Expr = &ast.BadExpr{}

// ScanGo returns the programs a Go file runs through the Runners, and the exec calls with a
// program it cannot read. consts holds the string constants of the file's package, by name;
// projectBins the names of the binaries the project builds (cmd/*, tests/netns/cmd/*): a program
// written filepath.Join(dir, "cable-broker") is one of them, not an indirect one.
func ScanGo(filename string, src []byte, consts map[string]string, projectBins map[string]bool) (GoFile, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return GoFile{}, err
	}
	g := goScan{fset: fset, pkg: f.Name.Name, consts: consts, projectBins: projectBins, out: GoFile{Pkg: f.Name.Name}}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		g.fn = fn.Name.Name
		ast.Inspect(fn.Body, g.visit)
	}
	return g.out, nil
}

// StringConsts returns the package-level string constants of a Go file, by name.
func StringConsts(filename string, src []byte) map[string]string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	consts := map[string]string{}
	if err != nil {
		return consts
	}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := literal(vs.Values[i], nil); ok {
						consts[name.Name] = s
					}
				}
			}
		}
	}
	return consts
}

type goScan struct {
	fset        *token.FileSet
	pkg         string
	fn          string
	consts      map[string]string
	projectBins map[string]bool
	out         GoFile
}

func (g *goScan) line(n ast.Node) int { return g.fset.Position(n.Pos()).Line }

func (g *goScan) visit(n ast.Node) bool {
	switch n := n.(type) {
	case *ast.CallExpr:
		args := expandArgs(n)
		g.netnsExec(args)
		if r, ok := g.runner(n.Fun); ok {
			g.call(n, r, args)
		}
	case *ast.CompositeLit:
		g.netnsExec(n.Elts)
	}
	return true
}

// runner matches a call's function against the Runners: pkg.Func from outside the package, or
// Func inside it.
func (g *goScan) runner(fun ast.Expr) (Runner, bool) {
	var qual, name string
	switch f := fun.(type) {
	case *ast.Ident:
		name = f.Name
	case *ast.SelectorExpr:
		name = f.Sel.Name
		if id, ok := f.X.(*ast.Ident); ok {
			qual = id.Name
		}
	default:
		return Runner{}, false
	}
	for _, r := range Runners {
		if r.Func == name && (qual == r.Pkg || g.pkg == r.Pkg && qual == "") {
			return r, true
		}
	}
	return Runner{}, false
}

func (g *goScan) call(n *ast.CallExpr, r Runner, args []ast.Expr) {
	if r.Arg >= len(args) {
		return
	}
	if r.Each {
		for _, a := range args[r.Arg:] {
			if s, ok := literal(a, g.consts); ok {
				g.record(s, g.line(a))
			}
		}
		return
	}
	prog, ok := literal(args[r.Arg], g.consts)
	if !ok {
		if (r.Pkg == "exec" || r.Pkg == "os") && !g.projectBin(args[r.Arg]) {
			g.indirect(n, args[r.Arg])
		}
		return
	}
	g.record(prog, g.line(n))
	g.shellArg(prog, args[r.Arg+1:], g.line(n))
	// ip netns exec NS CMD with a CMD that is not a literal: another runner in disguise.
	rest := args[r.Arg+1:]
	if (r.Pkg == "exec" || r.Pkg == "os") && prog == "ip" && len(rest) >= 3 && isLit(rest[0], "netns", g.consts) && isLit(rest[1], "exec", g.consts) {
		if len(rest) == 3 {
			g.indirect(n, unknownArg)
		} else if _, ok := literal(rest[3], g.consts); !ok {
			g.indirect(n, rest[3])
		}
	}
}

// projectBin reports whether e is filepath.Join(..., NAME) (or path.Join) of a binary the project
// builds.
func (g *goScan) projectBin(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Join" {
		return false
	}
	if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "filepath" && id.Name != "path" {
		return false
	}
	name, ok := literal(call.Args[len(call.Args)-1], g.consts)
	return ok && g.projectBins[name]
}

func isLit(e ast.Expr, want string, consts map[string]string) bool {
	s, ok := literal(e, consts)
	return ok && s == want
}

// shellArg scans the script of sh -c 'SCRIPT'.
func (g *goScan) shellArg(prog string, args []ast.Expr, line int) {
	base := prog[strings.LastIndexByte(prog, '/')+1:]
	if base != "sh" && base != "bash" || len(args) < 2 {
		return
	}
	if flag, _ := literal(args[0], g.consts); flag != "-c" {
		return
	}
	if script, ok := literal(args[1], g.consts); ok {
		for _, f := range ScanShell(script) {
			g.record(f.Program, line)
		}
	}
}

// netnsExec records CMD in an argument list holding "netns", "exec", NS, CMD (ip netns exec),
// whichever function it is handed to.
func (g *goScan) netnsExec(args []ast.Expr) {
	for i := 0; i+3 < len(args); i++ {
		a, _ := literal(args[i], g.consts)
		b, _ := literal(args[i+1], g.consts)
		if a != "netns" || b != "exec" {
			continue
		}
		if prog, ok := literal(args[i+3], g.consts); ok {
			g.record(prog, g.line(args[i+3]))
			g.shellArg(prog, args[i+4:], g.line(args[i+3]))
		}
	}
}

func (g *goScan) record(prog string, line int) {
	if !validName(prog) || strings.Contains(prog, "/") && !strings.HasPrefix(prog, "/") {
		return
	}
	g.out.Found = append(g.out.Found, Found{Program: prog, Line: line})
}

func (g *goScan) indirect(n *ast.CallExpr, prog ast.Expr) {
	for _, r := range Runners {
		if r.Pkg == g.pkg && r.Func == g.fn {
			return // a Runner itself: its callers name the program
		}
	}
	expr := "..."
	if prog != unknownArg {
		expr = string(exprText(prog))
	}
	g.out.Indirect = append(g.out.Indirect, Indirect{Line: g.line(n), Func: g.fn, Expr: expr})
}

// expandArgs returns a call's arguments, with a final slice... expanded where its elements are
// written out ([]string{...}... or append([]string{...}, rest...)...); what cannot be read is
// unknownArg.
func expandArgs(n *ast.CallExpr) []ast.Expr {
	if !n.Ellipsis.IsValid() || len(n.Args) == 0 {
		return n.Args
	}
	last := len(n.Args) - 1
	args := append([]ast.Expr{}, n.Args[:last]...)
	return append(args, sliceElems(n.Args[last])...)
}

func sliceElems(e ast.Expr) []ast.Expr {
	switch e := e.(type) {
	case *ast.CompositeLit:
		return e.Elts
	case *ast.CallExpr:
		if id, ok := e.Fun.(*ast.Ident); ok && id.Name == "append" && len(e.Args) > 0 {
			elems := sliceElems(e.Args[0])
			if e.Ellipsis.IsValid() {
				return append(elems, sliceElems(e.Args[len(e.Args)-1])...)
			}
			return append(elems, e.Args[1:]...)
		}
	}
	return []ast.Expr{unknownArg}
}

// literal evaluates a string literal, a constant of the package, or a concatenation of them.
func literal(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[e.Name]
		return s, ok
	case *ast.ParenExpr:
		return literal(e.X, consts)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok1 := literal(e.X, consts)
		y, ok2 := literal(e.Y, consts)
		return x + y, ok1 && ok2
	}
	return "", false
}

// exprText renders an expression for a report (identifiers, selectors, index and calls).
func exprText(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprText(e.X) + "." + e.Sel.Name
	case *ast.IndexExpr:
		return exprText(e.X) + "[" + exprText(e.Index) + "]"
	case *ast.BasicLit:
		return e.Value
	case *ast.CallExpr:
		return exprText(e.Fun) + "(...)"
	case *ast.StarExpr:
		return "*" + exprText(e.X)
	}
	return "..."
}
