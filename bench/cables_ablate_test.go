//go:build bench

package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// Turning the pieces of the agent's path off one at a time (CABLEMESH_CABLES_ABLATE), and the
// counter programs' run-time statistics.

// Pieces of the agent's path an ablation can turn off.
const (
	pieceProbes   = "probes"
	pieceCounters = "counters"
	pieceClamp    = "clamp"
)

// ctrPinPrefix starts the name of every counter link the agent pins (bpf/counters_linux.go).
const ctrPinPrefix = "ctr_"

// withAblations inserts, after each cable path whose driver is in drivers, the same path with
// each piece off and with all of them off.
func withAblations(paths []cablePath, drivers []string) []cablePath {
	var out []cablePath
	for _, p := range paths {
		out = append(out, p)
		if p.driver == "" || !slices.Contains(drivers, p.driver) {
			continue
		}
		all := []string{pieceProbes, pieceCounters, pieceClamp}
		for _, off := range [][]string{{pieceProbes}, {pieceCounters}, {pieceClamp}, all} {
			q := p
			q.off = off
			suffix := off[0]
			if len(off) > 1 {
				suffix = "all"
			}
			q.name = p.name + "-no-" + suffix
			q.what = p.what + " without " + strings.Join(off, ", ")
			out = append(out, q)
		}
	}
	return out
}

// turnOff turns the pieces off on both cable gateways and returns what turns them on again.
func turnOff(t *testing.T, m *harness.Mesh, cs []*harness.Cluster, driver string, off []string) (undo func()) {
	t.Helper()
	var undos []func()
	if slices.Contains(off, pieceCounters) {
		undos = append(undos, noopCounters(t, m, cs))
	}
	if slices.Contains(off, pieceProbes) {
		for _, c := range cs {
			c.WriteConfig(harness.MultiDriverConfig() + "healthCheck: {enabled: false}\n")
		}
		undos = append(undos, func() {
			for _, c := range cs {
				c.WriteConfig(harness.MultiDriverConfig())
			}
			time.Sleep(2 * time.Second) // the agents' reload
		})
		time.Sleep(2 * time.Second)
	}
	if slices.Contains(off, pieceClamp) {
		for _, c := range cs {
			if r := harness.NSRun(m.Ctx, c.GwNS, "nft", "delete", "table", "inet", "cablemesh"); r.Err != nil {
				t.Fatalf("nft delete table inet cablemesh in %s: %s", c.GwNS, r)
			}
		}
		undos = append(undos, func() {
			for _, c := range cs {
				if r := harness.NSRun(m.Ctx, c.GwNS, "nft", "list", "table", "inet", "cablemesh"); r.Err == nil {
					t.Logf("%s: the agent restored its MSS clamp table during the ablation run", c.Name)
				}
			}
			// The agent writes the table at start (and when its links change): restart both.
			t0 := time.Now()
			for _, c := range cs {
				c.StopAgent()
				c.StartAgent()
			}
			m.WaitWants(2*time.Minute, t0, cs, nil, harness.Connected(driver))
		})
	}
	return func() {
		// In this order: the counters' programs are back before a restart (clamp) adopts them.
		for _, u := range undos {
			u()
		}
	}
}

// ctrLinks are the counter links the agent of each gateway pinned, by pin path.
func ctrLinks(m *harness.Mesh, cs []*harness.Cluster) []string {
	var out []string
	for _, c := range cs {
		dir := filepath.Join(m.BPFFS, c.Name+"-gw", "links")
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ctrPinPrefix) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// noopCounters replaces the program of every counter link with one that returns TCX_NEXT at
// once (the tcx hook stays, the program's body goes) and returns what puts the agent's program
// back.
func noopCounters(t *testing.T, m *harness.Mesh, cs []*harness.Cluster) (undo func()) {
	t.Helper()
	noop := map[ebpf.AttachType]*ebpf.Program{}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, AttachType: at, License: "Dual BSD/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
		if err != nil {
			t.Fatalf("load a no-op tcx program: %v", err)
		}
		noop[at] = p
	}
	type swapped struct {
		l    link.Link
		orig *ebpf.Program
	}
	var done []swapped
	restore := func() {
		for _, s := range done {
			if err := s.l.Update(s.orig); err != nil {
				t.Errorf("put the counter program back: %v", err)
			}
			s.l.Close()
			s.orig.Close()
		}
		for _, p := range noop {
			p.Close()
		}
	}
	for _, pin := range ctrLinks(m, cs) {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			restore()
			t.Fatalf("load %s: %v", pin, err)
		}
		info, err := l.Info()
		if err != nil {
			restore()
			t.Fatalf("link info of %s: %v", pin, err)
		}
		orig, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			restore()
			t.Fatalf("program %d of %s: %v", info.Program, pin, err)
		}
		at := ebpf.AttachTCXEgress
		if strings.HasSuffix(pin, "_ingress") {
			at = ebpf.AttachTCXIngress
		}
		if err := l.Update(noop[at]); err != nil {
			orig.Close()
			l.Close()
			restore()
			t.Fatalf("replace the program of %s: %v", pin, err)
		}
		done = append(done, swapped{l, orig})
	}
	if len(done) == 0 {
		restore()
		t.Fatalf("no counter link pinned under %s", m.BPFFS)
	}
	return restore
}

// bpfStats keeps the kernel's BPF run-time statistics on while it is open.
type bpfStats struct{ closer io.Closer }

func startBPFStats() (*bpfStats, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run-time stats: %w", err)
	}
	return &bpfStats{closer: c}, nil
}

func (s *bpfStats) Close() error { return s.closer.Close() }

// progStats is one program's cumulative run time and run count.
type progStats struct{ runNs, runs uint64 }

// counterPrograms reads the statistics of the programs of the counter links both agents pinned,
// by program ID.
func (s *bpfStats) counterPrograms(m *harness.Mesh, cs []*harness.Cluster) map[uint32]progStats {
	out := map[uint32]progStats{}
	for _, pin := range ctrLinks(m, cs) {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			continue
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			continue
		}
		p, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			continue
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			continue
		}
		out[uint32(info.Program)] = progStats{runNs: uint64(st.Runtime.Nanoseconds()), runs: st.RunCount}
	}
	return out
}
