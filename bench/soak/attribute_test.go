//go:build bench

package soak

import (
	"testing"
	"time"
)

// A gap is charged to the fault in whose window it began, the longest per fault.
func TestAttributeGaps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	faults := []Fault{{at: at(10)}, {at: at(30)}, {at: at(50)}}
	// Replies every 0.1 s except: a 5 s gap from 10.0 (first fault), a 1 s gap from 12 (smaller,
	// same fault), a 38 s gap from 31 (second fault, spanning the third's start), none after 69.
	var replies []time.Time
	for s := 0.0; s < 80; s += 0.1 {
		switch {
		case s > 10.0 && s < 15.0, s > 12.0 && s < 13.0, s > 31.0 && s < 69.0:
			continue
		}
		replies = append(replies, at(s))
	}
	attributeGaps(faults, "a-b", replies, at(80))
	want := []float64{5, 38, 0.1}
	for i, f := range faults {
		if d := f.LongestGap - want[i]; d > 0.15 || d < -0.15 || f.GapPair != "a-b" {
			t.Errorf("fault %d: longest gap %.2f (pair %q), want %.1f", i, f.LongestGap, f.GapPair, want[i])
		}
	}
}
