package tooldeps

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func programs(found []Found) []string {
	var names []string
	for _, f := range found {
		names = append(names, f.Program)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func TestScanShell(t *testing.T) {
	src := `#!/usr/bin/env bash
# a comment: rsync here is not run
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
need=(iperf3 curl)
helper() { echo "$1"; }
helper x
if ! command -v jq >/dev/null 2>&1; then need+=(jq); fi
for _ in $(seq 1 3); do sleep 0.1; done
case $x in east) foo ;; *-gw) stat -f . ;; esac
ip netns exec "$NS" nft list ruleset 2>/dev/null | grep -q table
setsid ip netns exec "$NS" "$BIN/cable-agent" >>log 2>&1 </dev/null &
sh -c 'tcpdump -c 1' x
cat >"$f" <<YAML
notrun: $(true)
wget http://example
YAML
"$BIN/cablectl" status
./scripts/other.sh
X=1 Y=2 timeout 5 socat - -
((SECONDS - start < 5)) || die late
for ((i = 0; i < 3; i++)); do renice 1; done
nice -n 19 gzip x
`
	got := programs(ScanShell(src))
	want := []string{"cat", "die", "dirname", "foo", "grep", "gzip", "ip", "jq", "nft", "nice", "renice", "seq", "setsid", "sh", "sleep", "socat", "stat", "tcpdump", "timeout"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ScanShell found %v, want %v", got, want)
	}
}

func TestScanShellLines(t *testing.T) {
	found := ScanShell("a\n\nb 'x\ny'\nc \\\n d\ne\n")
	lines := map[string]int{}
	for _, f := range found {
		lines[f.Program] = f.Line
	}
	want := map[string]int{"a": 1, "b": 3, "c": 5, "e": 7}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("lines %v, want %v", lines, want)
	}
}

func TestScanGo(t *testing.T) {
	src := `package harness

import "os/exec"

const tool = "ethtool"

func a() {
	exec.Command("nft", "list", "ruleset")
	exec.CommandContext(ctx, tool, "-k")
	exec.LookPath("swanctl")
	Run(ctx, "ip", "netns", "exec", ns, "dig", "x")
	NSRun(ctx, ns, "conntrack", "-L")
	args := []string{"netns", "exec", ns, "ping", "-c", "1"}
	RunTimeout(ctx, d, "ip", append([]string{"netns", "exec", ns, "tc"}, more...)...)
	exec.Command("/bin/sh", "-c", "mount -t tmpfs x /run && exec socat")
	t.Run("not-a-program", func(t *testing.T) {})
}

func b(bin string) {
	exec.Command(bin, "x")
	exec.Command(filepath.Join(bin, "cablectl"), "status")
	exec.Command(filepath.Join(bin, "someone-elses"), "x")
	exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
}

func Run(ctx context.Context, name string, args ...string) { exec.CommandContext(ctx, name, args...) }
`
	g, err := ScanGo("x.go", []byte(src), StringConsts("x.go", []byte(src)), map[string]bool{"cablectl": true})
	if err != nil {
		t.Fatal(err)
	}
	got := programs(g.Found)
	want := []string{"/bin/sh", "conntrack", "dig", "ethtool", "ip", "mount", "nft", "ping", "socat", "swanctl", "tc"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ScanGo found %v, want %v", got, want)
	}
	var ind []string
	for _, in := range g.Indirect {
		ind = append(ind, in.Func+": "+in.Expr)
	}
	if want := []string{"b: bin", "b: filepath.Join(...)", "b: ..."}; !reflect.DeepEqual(ind, want) {
		t.Errorf("indirect %v, want %v (Run is a runner: its own exec is not reported, nor the project's cablectl)", ind, want)
	}
}

func TestParse(t *testing.T) {
	progs, err := Parse(strings.NewReader("# c\n\nip iproute2 demo,netns base\n/usr/lib/x pkg netns\ngo - unit toolchain\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(progs) != 3 || progs[0].Kind != "base" || progs[1].Kind != "apt" || !progs[1].For("netns") || progs[1].For("demo") || progs[2].Line != 5 {
		t.Errorf("parsed %+v", progs)
	}
	bad := map[string]string{
		"ip iproute2":                 "got 2 fields",
		"ip iproute2 demo,tset":       `stage "tset"`,
		"ip iproute2 demo cheap":      `kind "cheap"`,
		"go - unit":                   `package "-" of go`,
		"envoy envoy netns optional":  `package "envoy" of envoy`,
		"$(rm) x demo":                `program name "$(rm)"`,
		"rel/path x demo":             `program name "rel/path"`,
		"ip ipr;oute2 demo":           `package "ipr;oute2"`,
		"ip iproute2 demo\nip x unit": `listed again (first on line 1)`,
	}
	for in, want := range bad {
		_, err := Parse(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("ip iproute2 demo,netns base\n# x\ngo - unit toolchain\n")
	f.Add("/usr/lib/ipsec/charon strongswan-charon netns,run\n")
	f.Fuzz(func(t *testing.T, s string) {
		progs, err := Parse(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, p := range progs {
			// What the list accepts, bash reads back unchanged: no quotes, globs or expansions.
			if strings.ContainsAny(p.Name+p.Package, "$`'\"*?[]{}();&|<> \\") || len(p.Stages) == 0 {
				t.Errorf("accepted %+v", p)
			}
		}
	})
}
