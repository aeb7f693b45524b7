package health

import (
	"math"
	"slices"
	"time"
)

// DefaultWindow is how many of the latest RTT samples the statistics cover: 128 probes, i.e.
// 38 seconds at the default period of 300ms.
const DefaultWindow = 128

// Window keeps the latest RTT samples in a ring of fixed size. It is pure (no clock, no I/O) and
// not safe for concurrent use; the prober that owns it serialises access.
type Window struct {
	buf  []time.Duration
	next int // where the next sample goes
	n    int // samples held, at most len(buf)
	last time.Duration
}

// NewWindow returns a window of size samples; size < 1 means DefaultWindow.
func NewWindow(size int) *Window {
	if size < 1 {
		size = DefaultWindow
	}
	return &Window{buf: make([]time.Duration, size)}
}

// Add records one RTT sample, evicting the oldest when the window is full. Negative samples (a
// clock step between send and receive) are recorded as zero.
func (w *Window) Add(d time.Duration) {
	d = max(d, 0)
	w.buf[w.next] = d
	w.next = (w.next + 1) % len(w.buf)
	w.n = min(w.n+1, len(w.buf))
	w.last = d
}

// Len is the number of samples held.
func (w *Window) Len() int { return w.n }

// Summary describes the samples of a window. Last is the most recent sample; the others cover
// every sample in the window.
type Summary struct {
	Samples                            int
	Last, Min, Avg, Max, P50, P95, P99 time.Duration
}

// Summary computes the statistics of the samples held; ok is false when there are none.
func (w *Window) Summary() (s Summary, ok bool) {
	if w.n == 0 {
		return Summary{}, false
	}
	sorted := make([]time.Duration, w.n)
	copy(sorted, w.buf[:w.n]) // before the ring wraps the samples are buf[:n]; after, all of buf
	slices.Sort(sorted)
	var sum float64
	for _, d := range sorted {
		sum += float64(d)
	}
	return Summary{
		Samples: w.n,
		Last:    w.last,
		Min:     sorted[0],
		Avg:     time.Duration(math.Round(sum / float64(w.n))),
		Max:     sorted[w.n-1],
		P50:     Percentile(sorted, 50),
		P95:     Percentile(sorted, 95),
		P99:     Percentile(sorted, 99),
	}, true
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted samples by the nearest-rank
// method: the smallest sample such that at least p% of the samples are at or below it. It always
// returns a sample that was measured, never an interpolation, so a p99 over few samples is the
// maximum rather than a made-up value. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// p*n first: 95*20/100 is exactly 19, while 0.95*20 is 19.000000000000004 and would round up.
	rank := int(math.Ceil(p * float64(len(sorted)) / 100))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}
