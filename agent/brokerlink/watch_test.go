package brokerlink

import (
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestJoinWatchPartsMakesOneBatch(t *testing.T) {
	ev := func(key string) *apiv1.Event { return &apiv1.Event{Kind: "cluster", Key: key} }
	imports := &apiv1.ServiceImports{Imports: []*apiv1.ServiceImport{{Namespace: "shop", Name: "web"}}}
	tests := []struct {
		name         string
		parts        []*apiv1.WatchResponse
		wantSnapshot bool
		wantEvents   string
		wantRevision uint64
		wantImports  bool
	}{
		{
			name: "a snapshot in parts is one snapshot at the last part's revision",
			parts: []*apiv1.WatchResponse{
				{Snapshot: true, More: true, Events: []*apiv1.Event{ev("a"), ev("b")}},
				{Snapshot: true, More: true, Events: []*apiv1.Event{ev("c")}},
				{Snapshot: true, Events: []*apiv1.Event{ev("d")}, Revision: 40, Imports: imports},
			},
			wantSnapshot: true, wantEvents: "abcd", wantRevision: 40, wantImports: true,
		},
		{
			name: "deltas in parts keep their order and end at the last revision",
			parts: []*apiv1.WatchResponse{
				{More: true, Events: []*apiv1.Event{ev("x")}, Revision: 41, Imports: imports},
				{Events: []*apiv1.Event{ev("y")}, Revision: 42},
			},
			wantEvents: "xy", wantRevision: 42, wantImports: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := joinWatchParts(tt.parts)
			keys := ""
			for _, e := range got.GetEvents() {
				keys += e.GetKey()
			}
			if got.GetSnapshot() != tt.wantSnapshot || keys != tt.wantEvents || got.GetRevision() != tt.wantRevision ||
				(got.GetImports() != nil) != tt.wantImports || got.GetMore() {
				t.Errorf("joined %v", got)
			}
		})
	}
}
