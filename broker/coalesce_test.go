package broker

import (
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

func deltas(from, n int) store.Batch {
	var b store.Batch
	for i := range n {
		r := uint64(from + i)
		b.Events = append(b.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: store.KindEndpoint, Key: "c/n", Revision: r})
		b.Revision = r
	}
	return b
}

func TestCoalesce(t *testing.T) {
	tests := []struct {
		name       string
		waiting    []store.Batch // batches already buffered behind the first
		wantEvents int
		wantRev    uint64
		wantLeft   int
	}{
		{"nothing waiting leaves the batch as it is", nil, 3, 3, 0},
		{"waiting batches join it and bring their revision", []store.Batch{deltas(4, 2), deltas(6, 1)}, 6, 6, 0},
		{"it stops once it holds enough events", []store.Batch{deltas(4, maxCoalescedEvents), deltas(4+maxCoalescedEvents, 1)}, 3 + maxCoalescedEvents, 3 + maxCoalescedEvents, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := make(chan store.Batch, 8)
			for _, b := range tt.waiting {
				ch <- b
			}
			close(ch) // coalesce must not consume the close: the watch ends on it afterwards
			first := deltas(1, 3)
			got := coalesce(first, ch)
			if len(got.Events) != tt.wantEvents || got.Revision != tt.wantRev {
				t.Errorf("coalesce: %d events at revision %d, want %d at %d", len(got.Events), got.Revision, tt.wantEvents, tt.wantRev)
			}
			if len(first.Events) != 3 {
				t.Errorf("coalesce changed the batch it was given (shared with other watchers): %d events", len(first.Events))
			}
			left := 0
			for range ch {
				left++
			}
			if left != tt.wantLeft {
				t.Errorf("%d batches left in the channel, want %d", left, tt.wantLeft)
			}
		})
	}
}
