package benchresults

import (
	"math"
	"slices"
)

// MedianInterval is a distribution-free confidence interval for the median of the population xs
// were drawn from: the order statistics [x(k), x(n+1-k)] (sorted, 1-based) with the largest k
// whose coverage, 1 - 2·P(Binomial(n, 1/2) <= k-1), is at least minCoverage. It assumes only
// that the values are independent draws of one distribution, which is what a bench's rounds are
// meant to be; no normality, so a noisy VM's skewed rounds do not make it lie. ok is false when
// even the widest interval (the minimum and maximum) covers less than minCoverage: too few
// values to say anything at that level. xs is not reordered.
func MedianInterval(xs []float64, minCoverage float64) (lo, hi, coverage float64, ok bool) {
	n := len(xs)
	s := slices.Clone(xs)
	slices.Sort(s)
	best := 0
	for k := 1; 2*k <= n+1; k++ {
		c := 1 - 2*binomialCDFHalf(n, k-1)
		if c < minCoverage {
			break
		}
		best, coverage = k, c
	}
	if best == 0 {
		return math.NaN(), math.NaN(), 0, false
	}
	return s[best-1], s[n-best], coverage, true
}

// binomialCDFHalf is P(Binomial(n, 1/2) <= k).
func binomialCDFHalf(n, k int) float64 {
	var sum, c float64 = 0, 1 // c = C(n, i)
	for i := 0; i <= k && i <= n; i++ {
		sum += c
		c = c * float64(n-i) / float64(i+1)
	}
	return sum / math.Pow(2, float64(n))
}
