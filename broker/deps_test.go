package broker

import (
	"os/exec"
	"strings"
	"testing"
)

// datapathPackages are the drivers' datapath libraries: the broker only judges what drivers take
// and publish (their specs), so linking any of these would put host-changing code, and its size
// and attack surface, in a program that never touches a tunnel.
var datapathPackages = []string{
	"golang.zx2c4.com/wireguard/device",
	"github.com/strongswan/govici",
	"github.com/vishvananda/netlink",
}

// TestBrokerLinksNoDatapath: cable-broker's dependency set holds no driver datapath library. A
// failure names the chain of imports that pulls one in.
func TestBrokerLinksNoDatapath(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on PATH:", err)
	}
	const main = "github.com/cablemesh/cablemesh/cmd/cable-broker"
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, main).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", main, err, out)
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ":")
		imports[pkg] = strings.Fields(deps)
	}
	if len(imports[main]) == 0 {
		t.Fatalf("go list printed no imports of %s:\n%s", main, out)
	}
	for pkg := range imports {
		for _, bad := range datapathPackages {
			if pkg == bad || strings.HasPrefix(pkg, bad+"/") {
				t.Errorf("cable-broker links %s: %s", pkg, strings.Join(importChain(imports, main, pkg), " -> "))
			}
		}
	}
}

// importChain is a shortest chain of imports from `from` to `to` (breadth first).
func importChain(imports map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, d := range imports[p] {
			if _, seen := prev[d]; !seen {
				prev[d] = p
				queue = append(queue, d)
			}
		}
	}
	return []string{to}
}
