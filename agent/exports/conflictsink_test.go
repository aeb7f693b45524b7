package exports

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// sinkSource is a source that exports nothing and records the conflicts it is handed.
type sinkSource struct {
	mu    sync.Mutex
	calls [][]statusapi.ServiceConflict
}

func (s *sinkSource) Run(ctx context.Context, _ func([]*apiv1.ServiceExport)) error {
	<-ctx.Done()
	return nil
}

func (s *sinkSource) SetConflicts(c []statusapi.ServiceConflict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

func (s *sinkSource) last() ([]statusapi.ServiceConflict, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.calls) == 0 {
		return nil, 0
	}
	return s.calls[len(s.calls)-1], len(s.calls)
}

// conflictBroker answers SetExports with one conflict; no other call is made.
type conflictBroker struct{ apiv1.AgentClient }

func (conflictBroker) SetExports(context.Context, *apiv1.SetExportsRequest, ...grpc.CallOption) (*apiv1.SetExportsResponse, error) {
	return &apiv1.SetExportsResponse{Revision: 7, Conflicts: []*apiv1.ServiceConflict{{Cluster: "east", Field: "ports", Message: "shop/web: port 80 differs"}}}, nil
}

func TestAConflictSinkSourceHearsEverySyncsConflicts(t *testing.T) {
	x := New(config.Static{Cluster: "east", Node: "n1"}, Deps{Log: slog.New(slog.DiscardHandler), Live: func() config.Live { return config.Live{} },
		Backoff: func() *retry.Backoff { return &retry.Backoff{Min: time.Millisecond, Max: time.Millisecond} }})
	src := &sinkSource{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { x.RunSource(ctx, src) })
	for deadline := time.Now().Add(5 * time.Second); x.sink.Load() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("RunSource did not take the source as a conflict sink")
		}
	}
	if _, n := src.last(); n != 0 {
		t.Fatalf("%d conflict calls before any sync, want 0 (nothing is known yet)", n)
	}
	if err := x.send(ctx, conflictBroker{}, nil, 1); err != nil {
		t.Fatal(err)
	}
	got, n := src.last()
	want := statusapi.ServiceConflict{Cluster: "east", Field: "ports", Message: "shop/web: port 80 differs"}
	if n != 1 || len(got) != 1 || got[0] != want {
		t.Fatalf("after a sync: %d calls, last %+v; want 1 call with %+v", n, got, want)
	}
}
