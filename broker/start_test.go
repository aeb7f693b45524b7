package broker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/broker/store"
)

// hungStore is a store that never answers: every read and write waits for its context to end,
// as a store whose backend stopped answering does.
type hungStore struct {
	store.Store
	closed atomic.Bool
}

func (h *hungStore) View(ctx context.Context, _ func(store.ReadTx) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func (h *hungStore) Update(ctx context.Context, _ func(store.Tx) error) (store.Commit, error) {
	<-ctx.Done()
	return store.Commit{}, ctx.Err()
}

func (h *hungStore) Close() error {
	h.closed.Store(true)
	return h.Store.Close()
}

// A store that does not answer fails New after the start timeout, or when the caller's context
// ends, with an error that says which; New does not hang, and closes the store it was given.
func TestNewGivesUpOnAStoreThatDoesNotAnswer(t *testing.T) {
	tests := []struct {
		name         string
		startTimeout time.Duration
		cancelAfter  time.Duration // 0: the context does not end
		want         error
		wantWords    []string
	}{
		{name: "the start timeout ends it", startTimeout: 200 * time.Millisecond, want: context.DeadlineExceeded,
			wantWords: []string{"default policy", "did not answer within the start timeout 200ms"}},
		{name: "the caller's context ends it", startTimeout: time.Hour, cancelAfter: 200 * time.Millisecond, want: context.Canceled,
			wantWords: []string{"default policy", "context canceled"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &hungStore{Store: store.NewMemory(store.Options{})}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancelAfter > 0 {
				time.AfterFunc(tt.cancelAfter, cancel)
			}
			type result struct {
				srv *Server
				err error
			}
			done := make(chan result, 1)
			start := time.Now()
			go func() {
				srv, err := New(ctx, Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Store: st, StartTimeout: tt.startTimeout, Logger: slog.New(slog.DiscardHandler)})
				done <- result{srv, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("New still waits on the store after 10s")
			}
			if r.err == nil {
				r.srv.Close()
				t.Fatal("New succeeded on a store that never answered")
			}
			if !errors.Is(r.err, tt.want) {
				t.Errorf("error %q does not wrap %v", r.err, tt.want)
			}
			for _, w := range tt.wantWords {
				if !strings.Contains(r.err.Error(), w) {
					t.Errorf("error %q does not say %q", r.err, w)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("New gave up after %v", d)
			}
			if !st.closed.Load() {
				t.Error("New did not close the store it failed on")
			}
		})
	}
}
