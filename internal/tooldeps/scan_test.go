package tooldeps

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// indirectAllowed are the exec calls whose program is not a literal and is not a program the
// list should name: the repository's own binaries, test binaries re-running themselves, and
// programs found first with exec.LookPath (of a literal the scan sees). Key: file and function.
var indirectAllowed = map[string]string{
	"bench/dns/dns_test.go startAgentDNS":                     "the test binary itself (os.Args[0])",
	"bench/dns/dns_test.go startCoreDNS":                      "CoreDNS, built by tests/k8s/coredns/build.sh",
	"bench/dns/dns_test.go coreDNSVersion":                    "CoreDNS, built by tests/k8s/coredns/build.sh",
	"bench/scale/scale_test.go startBroker":                   "the cable-broker the bench builds",
	"cmd/cablectl/main_test.go TestExitCodes":                 "the test binary itself (os.Args[0]) running main",
	"broker/store/etcdtest/etcdtest.go Start":                 `etcd, from exec.LookPath("etcd")`,
	"cable/wireguard/isolate.go RunIsolated":                  "the agent re-running itself (os.Executable)",
	"deploy/kubectl_test.go kubectlApplyDryRun":               `kubectl, from exec.LookPath("kubectl")`,
	"deploy/kubectl_test.go TestKustomizeBuildsEveryObject":   `kubectl, from exec.LookPath("kubectl")`,
	"deploy/systemd_test.go TestMakeInstall":                  `systemd-analyze, from exec.LookPath("systemd-analyze")`,
	"internal/tooldeps/list.go Present":                       "the programs of scripts/deps.list itself",
	"tests/netns/bpflb/client_test.go startClient":            "the test binary itself",
	"tests/vm/guestinit/main.go runCommand":                   "the VM guest runs the commands tests/vm sends it: test binaries",
	"tests/netns/ingressnft_test.go start":                    "tcpcheck, built from tests/netns/cmd",
	"tests/netns/vxlandriver/vxlandriver_test.go tcpTransfer": "the driver's test peer, built by the test",
	"tests/k8s/cluster_test.go run":                           "tests/k8s/cluster.sh, the project's own script",
	"tests/k8s/cluster_test.go kc":                            "kubectl, built by tests/k8s/build.sh",
	"tests/k8s/crosscluster_test.go nodeLeftovers":            "tests/k8s/cluster.sh nodeexec, the project's own script (it runs find, of findutils, on the node)",
	"tests/k8s/crosscluster_test.go script":                   "scripts/k8s-demo.sh and k8s-demo-down.sh, the project's own scripts",
	"tests/k8s/crosscluster_test.go upMeshApps":               "tests/k8s/cluster.sh (rss), the project's own script",
	"tests/k8s/crosscluster_test.go kc":                       "kubectl, built by tests/k8s/build.sh",
	"tests/k8s/helm_test.go recordGatewayRoll":                "kubectl, built by tests/k8s/build.sh",
	"tests/k8s/clusterdns_test.go clusterDNS":                 "tests/k8s/coredns/cluster-dns.sh, the project's own script",
	"tests/netns/xdsguard_test.go fetchSecretAs":              "xdsgrpc, built from tests/netns/cmd",
	"tests/k8s/helm_test.go helmBin":                          "tests/helm/build.sh, the project's own script",
	"tests/k8s/helm_test.go helm":                             "helm, built from helm.sh/helm by tests/helm/build.sh",
}

// notPrograms are names the scan finds that are meant not to exist.
var notPrograms = map[string]string{
	"cablemesh-no-such-tool": "internal/benchresults's test of a program that is not installed",
}

// TestEveryProgramTheRepositoryRunsIsListed is the guard: a program the repository's Go code or
// shell scripts run (exec.Command("foo"), harness.NSRun(ctx, ns, "foo"), ip netns exec NS foo, a
// script's foo) must be in scripts/deps.list for the stage that runs it, or a fresh machine's
// `make test` (or `make demo`, or a bench) fails on a program install-deps.sh never installed.
func TestEveryProgramTheRepositoryRunsIsListed(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	progs, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Program{}
	for _, p := range progs {
		byName[p.Name] = p
	}
	scan, err := ScanRepo(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.Uses) < 100 {
		t.Fatalf("the scan found only %d uses of programs; it has stopped seeing them", len(scan.Uses))
	}
	var problems []string
	for _, u := range scan.Uses {
		p, ok := byName[u.Program]
		switch {
		case notPrograms[u.Program] != "":
		case !ok:
			problems = append(problems, fmt.Sprintf("%s:%d runs %q, which %s does not list; add a line: %s <debian-package> %s",
				u.File, u.Line, u.Program, ListPath, u.Program, orAny(u.Stage)))
		case u.Stage != "" && !p.For(u.Stage):
			problems = append(problems, fmt.Sprintf("%s:%d runs %q in the %s stage, but %s line %d lists it for %s only; add %s to its stages",
				u.File, u.Line, u.Program, u.Stage, ListPath, p.Line, strings.Join(p.Stages, ","), u.Stage))
		}
	}
	seen := map[string]bool{}
	for _, in := range scan.Indirect {
		fn, _, _ := strings.Cut(in.Program, ": ")
		key := in.File + " " + fn
		seen[key] = true
		if _, ok := indirectAllowed[key]; !ok {
			problems = append(problems, fmt.Sprintf("%s:%d: %s runs a program the scan cannot read (%s); make it a literal, add the function to tooldeps.Runners if it runs programs it is handed, or to indirectAllowed if it runs a binary the project builds",
				in.File, in.Line, fn, strings.TrimPrefix(in.Program, fn+": ")))
		}
	}
	for key := range indirectAllowed {
		if !seen[key] {
			problems = append(problems, fmt.Sprintf("indirectAllowed names %s, which no longer runs a program indirectly; remove it", key))
		}
	}
	sort.Strings(problems)
	for _, p := range slices.Compact(problems) {
		t.Error(p)
	}
}

func orAny(stage string) string {
	if stage == "" {
		return "<stages>"
	}
	return stage
}

// TestListIsConsistent keeps the demo's set small: it is what a first `make demo` installs, and
// the heavy packages only the tests or the benches need stay out of it.
func TestListIsConsistent(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	progs, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	var demo []string
	for _, p := range progs {
		if p.For("demo") && p.Kind == "apt" && !slices.Contains(demo, p.Package) {
			demo = append(demo, p.Package)
		}
	}
	heavy := []string{"qemu-system-x86", "clang", "llvm", "etcd-server", "kubernetes-client", "dnsperf", "iperf3", "nftables"}
	for _, h := range heavy {
		if slices.Contains(demo, h) {
			t.Errorf("the demo's set %v holds %s, which only the tests or benches need", demo, h)
		}
	}
}

// TestInstallDepsReadsTheListAsParseDoes runs install-deps.sh --packages (bash reading the list)
// and compares its packages with the ones Parse gives for the same stages.
func TestInstallDepsReadsTheListAsParseDoes(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	progs, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	profiles := map[string][]string{
		"demo":  {"demo"},
		"test":  {"unit", "netns", "vm", "run"},
		"bench": {"bench", "netns", "run"},
		"image": {"image"},
	}
	for profile, stages := range profiles {
		var want []string
		for _, p := range progs {
			if p.Package != "-" && slices.ContainsFunc(stages, p.For) {
				want = append(want, p.Package)
			}
		}
		slices.Sort(want)
		want = slices.Compact(want)
		out, err := exec.Command("bash", filepath.Join(root, "scripts/install-deps.sh"), "--packages", profile).Output()
		if err != nil {
			t.Fatalf("install-deps.sh --packages %s: %v", profile, err)
		}
		if got := strings.Fields(string(out)); !slices.Equal(got, want) {
			t.Errorf("install-deps.sh --packages %s = %v, want (from the list) %v", profile, got, want)
		}
	}
}
