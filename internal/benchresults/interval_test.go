package benchresults

import (
	"math"
	"slices"
	"testing"
)

func TestMedianIntervalPicksTheNarrowestOrderStatisticsThatCover(t *testing.T) {
	for _, tc := range []struct {
		name        string
		xs          []float64
		min         float64
		lo, hi, cov float64
		ok          bool
	}{
		// n=7: [x(1), x(7)] covers 1-2/128 = 0.984; [x(2), x(6)] only 1-2·8/128 = 0.875.
		{"seven rounds at 90 % take the extremes", []float64{1.17, 1.02, 0.94, 0.98, 1.09, 0.98, 1.08}, 0.90, 0.94, 1.17, 1 - 2.0/128, true},
		{"seven rounds at 85 % drop one at each end", []float64{7, 1, 6, 2, 5, 3, 4}, 0.85, 2, 6, 1 - 16.0/128, true},
		// n=15: k=4 covers 1-2·P(B<=3) = 1-2·576/32768 = 0.9648; k=5 only 0.8815.
		{"fifteen values at 95 %", []float64{15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 0.95, 4, 12, 1 - 2*576.0/32768, true},
		// n=4: the extremes cover 1-2/16 = 0.875, short of 0.90.
		{"four values are too few for 90 %", []float64{1, 2, 3, 4}, 0.90, math.NaN(), math.NaN(), 0, false},
		{"no values", nil, 0.5, math.NaN(), math.NaN(), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.xs)
			lo, hi, cov, ok := MedianInterval(tc.xs, tc.min)
			if ok != tc.ok {
				t.Fatalf("MedianInterval(%v, %v) ok = %v, want %v", tc.xs, tc.min, ok, tc.ok)
			}
			if !ok {
				if !math.IsNaN(lo) || !math.IsNaN(hi) {
					t.Errorf("without an interval got [%v, %v], want NaN bounds", lo, hi)
				}
				return
			}
			if lo != tc.lo || hi != tc.hi || math.Abs(cov-tc.cov) > 1e-12 {
				t.Errorf("MedianInterval(%v, %v) = [%v, %v] at %.4f, want [%v, %v] at %.4f", tc.xs, tc.min, lo, hi, cov, tc.lo, tc.hi, tc.cov)
			}
			if cov < tc.min {
				t.Errorf("coverage %.4f is below the %.2f asked for", cov, tc.min)
			}
			if !slices.Equal(in, tc.xs) {
				t.Errorf("MedianInterval reordered its input: %v, was %v", tc.xs, in)
			}
		})
	}
}

func TestBinomialCDFHalfSumsToOne(t *testing.T) {
	for n := 0; n <= 40; n++ {
		if got := binomialCDFHalf(n, n); math.Abs(got-1) > 1e-12 {
			t.Errorf("P(B(%d, 1/2) <= %d) = %v, want 1", n, n, got)
		}
	}
	if got, want := binomialCDFHalf(7, 1), 8.0/128; got != want {
		t.Errorf("P(B(7, 1/2) <= 1) = %v, want %v", got, want)
	}
}
