package health

import (
	"testing"
	"time"
)

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

func msList(fs ...float64) []time.Duration {
	out := make([]time.Duration, len(fs))
	for i, f := range fs {
		out[i] = ms(f)
	}
	return out
}

func TestWindowSummary(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i) // 100, 99, ..., 1: added out of order on purpose
	}
	tests := []struct {
		name    string
		size    int
		samples []time.Duration
		want    Summary
		ok      bool
	}{
		{name: "an empty window has no summary", size: 4, ok: false},
		{name: "one sample is every statistic", size: 4, samples: msList(0.4), ok: true,
			want: Summary{Samples: 1, Last: ms(0.4), Min: ms(0.4), Avg: ms(0.4), Max: ms(0.4), P50: ms(0.4), P95: ms(0.4), P99: ms(0.4)}},
		{name: "last is the latest sample, not the largest", size: 8, samples: msList(1, 5, 2), ok: true,
			want: Summary{Samples: 3, Last: ms(2), Min: ms(1), Avg: 2666667 * time.Nanosecond /* 8ms/3, rounded */, Max: ms(5), P50: ms(2), P95: ms(5), P99: ms(5)}},
		{name: "an even count takes the lower middle as p50 (nearest rank)", size: 8, samples: msList(4, 1, 3, 2), ok: true,
			want: Summary{Samples: 4, Last: ms(2), Min: ms(1), Avg: ms(2.5), Max: ms(4), P50: ms(2), P95: ms(4), P99: ms(4)}},
		{name: "a full window forgets its oldest samples", size: 3, samples: msList(100, 200, 1, 2, 3), ok: true,
			want: Summary{Samples: 3, Last: ms(3), Min: ms(1), Avg: ms(2), Max: ms(3), P50: ms(2), P95: ms(3), P99: ms(3)}},
		{name: "a hundred samples give the textbook percentiles", size: 128, samples: msList(hundred...), ok: true,
			want: Summary{Samples: 100, Last: ms(1), Min: ms(1), Avg: ms(50.5), Max: ms(100), P50: ms(50), P95: ms(95), P99: ms(99)}},
		{name: "one outlier in twenty shows in p99 and max but not p95", size: 128,
			samples: msList(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 250), ok: true,
			want: Summary{Samples: 20, Last: ms(250), Min: ms(1), Avg: ms(13.45), Max: ms(250), P50: ms(1), P95: ms(1), P99: ms(250)}},
		{name: "a negative sample from a clock step counts as zero", size: 4, samples: []time.Duration{-time.Millisecond, ms(2)}, ok: true,
			want: Summary{Samples: 2, Last: ms(2), Min: 0, Avg: ms(1), Max: ms(2), P50: 0, P95: ms(2), P99: ms(2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWindow(tt.size)
			for _, s := range tt.samples {
				w.Add(s)
			}
			got, ok := w.Summary()
			if ok != tt.ok || got != tt.want {
				t.Errorf("Summary() = %+v, %v\nwant        %+v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestWindowSizeDefaultsAndWraps(t *testing.T) {
	w := NewWindow(0)
	for i := range 1000 {
		w.Add(time.Duration(i))
	}
	if w.Len() != DefaultWindow {
		t.Fatalf("Len() = %d after 1000 samples, want the default window %d", w.Len(), DefaultWindow)
	}
	s, _ := w.Summary()
	if s.Min != 1000-DefaultWindow || s.Max != 999 || s.Last != 999 {
		t.Errorf("after wrapping, min/max/last = %v/%v/%v, want %v/999/999", s.Min, s.Max, s.Last, 1000-DefaultWindow)
	}
}

func TestPercentile(t *testing.T) {
	ten := msList(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"no samples give zero", nil, 50, 0},
		{"the median of ten is the fifth", ten, 50, ms(5)},
		{"p95 of ten is the tenth", ten, 95, ms(10)},
		{"p90 of ten is exactly the ninth", ten, 90, ms(9)},
		{"p10 of ten is the first", ten, 10, ms(1)},
		{"p100 is the maximum", ten, 100, ms(10)},
		{"a tiny percentile is the minimum, never below it", ten, 0.0001, ms(1)},
		{"p95 of twenty is exactly the nineteenth", msList(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 95, ms(19)},
	}
	for _, tt := range tests {
		if got := Percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: Percentile(p=%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}
