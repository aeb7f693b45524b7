//go:build bench

package bench

import (
	"math"
	"strings"
	"testing"
)

// TestCableRatiosCarryTheIntervalAndTheGoal feeds cableRatios two paths over seven rounds and
// checks the ratio of medians, the per-round interval and the goal's verdict.
func TestCableRatiosCarryTheIntervalAndTheGoal(t *testing.T) {
	hand := []float64{10, 10, 10, 10, 10, 10, 10}
	cable := []float64{11.7, 10.2, 9.4, 9.8, 10.9, 9.8, 10.8}
	runs := func(g []float64) []CableRun {
		var rs []CableRun
		for i, v := range g {
			rs = append(rs, CableRun{Round: i + 1, Streams: 1, Gbps: v}, CableRun{Round: i + 1, Streams: 4, Gbps: v / 2})
		}
		return rs
	}
	rs := cableRatios([]CablePathResult{{Name: "wg-hand", Runs: runs(hand)}, {Name: "wg-cable", Runs: runs(cable)}}, 7)
	if len(rs) != 2 {
		t.Fatalf("got %d ratios, want wg-cable / wg-hand for 1 and 4 streams: %+v", len(rs), rs)
	}
	r := rs[0]
	if r.Name != "wg-cable / wg-hand" || r.Goal != 1.0 {
		t.Fatalf("ratio %q with goal %v, want wg-cable / wg-hand with goal 1.0", r.Name, r.Goal)
	}
	if r.Ratio < 1.019 || r.Ratio > 1.021 || r.RoundMedian != r.Ratio {
		t.Errorf("ratio %.4f, median of rounds %.4f, want both 1.02", r.Ratio, r.RoundMedian)
	}
	if math.Abs(r.RoundLow-0.94) > 1e-9 || math.Abs(r.RoundHigh-1.17) > 1e-9 || r.RoundCoverage < 0.98 {
		t.Errorf("interval [%v, %v] at %v, want [0.94, 1.17] at 0.984 (the extremes of 7 rounds)", r.RoundLow, r.RoundHigh, r.RoundCoverage)
	}
	if v := goalVerdict(r); !strings.HasPrefix(v, "met (1.020; the goal is inside the interval") {
		t.Errorf("verdict %q, want met and within the noise", v)
	}
	r.Ratio, r.RoundLow, r.RoundHigh = 0.8, 0.7, 0.85
	if v := goalVerdict(r); !strings.HasPrefix(v, "not met (0.800; the interval lies below the goal") {
		t.Errorf("verdict %q, want not met with the interval below the goal", v)
	}
	if lines := goalLines(rs); len(lines) != 1 || !strings.Contains(lines[0], "| wg-cable / wg-hand | >= 1.00 | met") {
		t.Errorf("goal table rows %q, want one for wg-cable / wg-hand, met", lines)
	}
}
