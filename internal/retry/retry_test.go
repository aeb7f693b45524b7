package retry

import (
	"context"
	"testing"
	"time"
)

func TestBackoffDoublesWithinBoundsAndResets(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	steps := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, s := range steps {
		step := s * time.Millisecond
		d := b.Next()
		if d < step || d > min(step+step/2, b.Max) {
			t.Errorf("attempt %d: wait %v, want in [%v, %v]", i, d, step, min(step+step/2, b.Max))
		}
	}
	b.Reset()
	if d := b.Next(); d < b.Min || d > b.Min+b.Min/2 {
		t.Errorf("after Reset: wait %v, want about %v", d, b.Min)
	}
}

func TestSleepStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep on a cancelled context reported a completed wait")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("a 1 ms Sleep did not complete")
	}
}
