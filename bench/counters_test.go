//go:build bench

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/internal/scratchns"
)

// TestCounterProgram (make bench-counters) measures what the tcx counter program costs per packet,
// in the kernel (BPF_PROG_TEST_RUN, one run per call, so each call's timing overhead is the same):
//
//	noop         a tcx program that returns TCX_NEXT at once: the anchor (the hook and the timing)
//	cache-hit    the counter program on a packet to the address its CPU looked up last: what
//	             every packet of a stream but the first pays
//	cache-miss   the counter program on packets alternating between two remote clusters: the
//	             LPM trie walk every packet paid before the per-CPU cache
//	baseline     with CABLEMESH_COUNTERS_BASELINE=<counters_bpfel.o of another revision>, that
//	             revision's egress program on the cache-hit packet (its own maps, the same subnets):
//	             `git show <rev>:bpf/counters_bpfel.o > /tmp/counters-old.o`
//
// Each round times every program in turn, CABLEMESH_COUNTERS_CALLS calls each (20,000); the
// results are the medians over CABLEMESH_COUNTERS_ROUNDS rounds (5), with 64 subnets of 64
// clusters in the trie, like a mesh of 64 clusters.
func TestCounterProgram(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (BPF programs, a network namespace): run it with make bench-counters as root")
	}
	calls, rounds := envInt("CABLEMESH_COUNTERS_CALLS", 20000), envInt("CABLEMESH_COUNTERS_ROUNDS", 5)
	progs := counterPrograms(t)
	noop, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer noop.Close()

	// IPv4 packets from the node to 10.<c>.0.9, cluster c's subnet 10.<c>.0.0/16.
	pkt := func(c byte) []byte {
		p := make([]byte, 14+20+8+64)
		p[12], p[13] = 0x08, 0x00
		ip := p[14:]
		ip[0], ip[2], ip[3], ip[8], ip[9] = 0x45, 0, byte(len(ip)), 64, 17
		copy(ip[12:16], []byte{10, 0, 0, 1})
		copy(ip[16:20], []byte{10, c, 0, 9})
		return p
	}
	type variant struct {
		name string
		prog *ebpf.Program
		pkts [][]byte
	}
	variants := []variant{
		{"noop", noop, [][]byte{pkt(1)}},
		{"cache-hit", progs, [][]byte{pkt(1)}},
		{"cache-miss", progs, [][]byte{pkt(1), pkt(2)}},
	}
	if path := os.Getenv("CABLEMESH_COUNTERS_BASELINE"); path != "" {
		variants = append(variants, variant{"baseline", baselineProgram(t, path), [][]byte{pkt(1)}})
		t.Logf("baseline: the egress program of %s", path)
	}
	res := CounterProgramResult{Calls: calls, Rounds: rounds, Subnets: 64, Baseline: os.Getenv("CABLEMESH_COUNTERS_BASELINE"), NsPerRun: map[string][]float64{}}
	for r := range rounds {
		for _, v := range variants {
			var total time.Duration
			for i := range calls {
				ret, d, err := v.prog.Benchmark(v.pkts[i%len(v.pkts)], 1, nil)
				if err != nil {
					t.Fatalf("%s: BPF_PROG_TEST_RUN: %v", v.name, err)
				}
				if int32(ret) != -1 {
					t.Fatalf("%s: returned %d, want TCX_NEXT (-1)", v.name, int32(ret))
				}
				total += d
			}
			ns := float64(total.Nanoseconds()) / float64(calls)
			res.NsPerRun[v.name] = append(res.NsPerRun[v.name], ns)
			t.Logf("round %d %s: %.1f ns/run", r+1, v.name, ns)
		}
	}
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.Kernel, res.CPUs, res.Revision = kernelRelease(), runtime.NumCPU(), gitRevision()
	res.Median = map[string]float64{}
	for name, v := range res.NsPerRun {
		res.Median[name] = medianOf(v)
	}
	writeCounterProgramResults(t, res)
}

// CounterProgramResult is bench/results/counters-<date>.json.
type CounterProgramResult struct {
	Date     string
	Kernel   string
	CPUs     int
	Revision string
	Calls    int
	Rounds   int
	Subnets  int
	Baseline string               // CABLEMESH_COUNTERS_BASELINE
	NsPerRun map[string][]float64 // per round
	Median   map[string]float64
}

// baselineProgram loads the egress counter program of another build's object (its maps fresh and
// unpinned) with the same 64 subnets as counterPrograms.
func baselineProgram(t *testing.T, path string) *ebpf.Program {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		t.Fatalf("CABLEMESH_COUNTERS_BASELINE: %v", err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("CABLEMESH_COUNTERS_BASELINE: load %s: %v", path, err)
	}
	t.Cleanup(coll.Close)
	subnets, prog := coll.Maps["cm_ctr_subnet"], coll.Programs["cm_ctr_egress"]
	if subnets == nil || prog == nil {
		t.Fatalf("CABLEMESH_COUNTERS_BASELINE: %s has no cm_ctr_subnet map or cm_ctr_egress program", path)
	}
	for c := 1; c <= 64; c++ {
		// The map's key: prefix length of the 128-bit address, then the IPv4-mapped address.
		key := make([]byte, 20)
		key[0] = 96 + 16
		key[14], key[15], key[16], key[17] = 0xff, 0xff, 10, byte(c)
		if err := subnets.Put(key, uint32(c)); err != nil {
			t.Fatalf("CABLEMESH_COUNTERS_BASELINE: fill the subnets: %v", err)
		}
	}
	return prog
}

// counterPrograms attaches the counters to a veth in a scratch network namespace (the test's
// thread stays in it), fills the subnet map with 64 clusters' subnets, and returns the egress
// program the link runs.
func counterPrograms(t *testing.T) *ebpf.Program {
	t.Helper()
	scratchns.Enter(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth d0: %v", err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	ctr, err := bpf.OpenCounters(context.Background(), bpf.Options{PinDir: "/sys/fs/bpf/cmctr-" + hex.EncodeToString(b)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctr.Remove(); err != nil {
			t.Errorf("remove counters: %v", err)
		}
	})
	if err := ctr.Attach("d0"); err != nil {
		t.Fatal(err)
	}
	subnets := map[netip.Prefix]uint32{}
	for c := 1; c <= 64; c++ {
		subnets[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(c), 0, 0}), 16)] = uint32(c)
	}
	if err := ctr.SetSubnets(subnets); err != nil {
		t.Fatal(err)
	}
	atts, err := ctr.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(atts, func(a bpf.Attachment) bool { return strings.HasSuffix(a.Hook, "_egress") })
	if i < 0 {
		t.Fatalf("no egress counter attachment: %+v", atts)
	}
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(atts[i].ProgramID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func writeCounterProgramResults(t *testing.T, res CounterProgramResult) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# The tcx counter program's cost per packet (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, revision %s. BPF_PROG_TEST_RUN, one run per call, %d calls per variant and round, %d rounds interleaved; %d subnets of as many clusters in the LPM trie; an IPv4 packet of 106 bytes.\n\n",
		res.Kernel, res.CPUs, res.Revision, res.Calls, res.Rounds, res.Subnets)
	cmd := "make bench-counters"
	if res.Baseline != "" {
		cmd = "CABLEMESH_COUNTERS_BASELINE=" + res.Baseline + " " + cmd
	}
	fmt.Fprintf(&b, "Command: `%s`\n\n", cmd)
	fmt.Fprintf(&b, "| variant | ns per run, per round | median | less the no-op anchor |\n|---|---|---|---|\n")
	for _, name := range []string{"noop", "cache-hit", "cache-miss", "baseline"} {
		if _, ok := res.Median[name]; !ok {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | **%.1f** | %.1f |\n", name, floats(res.NsPerRun[name]), res.Median[name], res.Median[name]-res.Median["noop"])
	}
	fmt.Fprintf(&b, "\n- noop: a tcx program returning TCX_NEXT at once (the hook's and the timing's own cost).\n")
	fmt.Fprintf(&b, "- cache-hit: the counter program on a packet to the address its CPU looked up last (every packet of a stream but its first).\n")
	fmt.Fprintf(&b, "- cache-miss: packets alternating between two clusters, so every run walks the LPM trie and refills the cache (what every packet cost before the cache).\n")
	if _, ok := res.Median["baseline"]; ok {
		fmt.Fprintf(&b, "- baseline: the egress program of %s on the cache-hit packet.\n", res.Baseline)
	}
	benchresults.Save(t, "results", "counters", res, b.String())
}
