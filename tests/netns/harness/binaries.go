package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Binaries are the paths of the programs a mesh runs.
type Binaries struct {
	Broker   string // cable-broker
	Agent    string // cable-agent
	Cablectl string // cablectl
	TCPCheck string // tests/netns/cmd/tcpcheck
}

// BinEnv names a directory holding prebuilt cable-broker, cable-agent and cablectl (`make build`
// puts them in bin/). Without it the harness builds them once per test process.
const BinEnv = "CABLEMESH_BIN"

var (
	buildOnce sync.Once
	buildBins Binaries
	buildErr  error
	buildDir  string
)

// ModuleRoot returns the directory of the cablemesh module (where go.mod is).
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := MustRun(ctx, "go", "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(out)
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the cablemesh module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// Build returns the binaries, building what is missing once per process: each comes from
// $CABLEMESH_BIN when it holds it (the VM stage of tests/vm puts tcpcheck there too: a go build
// in the guest costs a minute under TCG).
func Build(ctx context.Context) (Binaries, error) {
	buildOnce.Do(func() { buildBins, buildErr = build(ctx) })
	return buildBins, buildErr
}

func build(ctx context.Context) (Binaries, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return Binaries{}, err
	}
	dir, err := os.MkdirTemp("", "cablemesh-bin-")
	if err != nil {
		return Binaries{}, err
	}
	buildDir = dir
	var pkgs []string
	var b Binaries
	from := os.Getenv(BinEnv)
	have := func(name string) bool {
		if from == "" {
			return false
		}
		st, err := os.Stat(filepath.Join(from, name))
		return err == nil && st.Mode()&0o111 != 0
	}
	for _, x := range []struct {
		name string
		dst  *string
		pkg  string
	}{{"cable-broker", &b.Broker, "./cmd/cable-broker"}, {"cable-agent", &b.Agent, "./cmd/cable-agent"},
		{"cablectl", &b.Cablectl, "./cmd/cablectl"}, {"tcpcheck", &b.TCPCheck, "./tests/netns/cmd/tcpcheck"}} {
		if have(x.name) {
			*x.dst = filepath.Join(from, x.name)
			continue
		}
		*x.dst = filepath.Join(dir, x.name)
		pkgs = append(pkgs, x.pkg)
	}
	if len(pkgs) == 0 {
		return b, nil
	}
	args := append([]string{"-C", root, "build", "-o", dir + "/"}, pkgs...)
	// A cold build of the binaries takes minutes on two cores.
	if r := RunTimeout(ctx, 15*time.Minute, "go", args...); r.Err != nil {
		return Binaries{}, fmt.Errorf("build the binaries for the netns tests: %s", r)
	}
	return b, nil
}

// RemoveBuild deletes the binaries Build made (call once, from TestMain).
func RemoveBuild() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}
