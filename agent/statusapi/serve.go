package statusapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cablemesh/cablemesh/internal/unixsock"
)

// Serve serves h on the unix socket path (statusSocket) until stop: parent dir created, a stale socket removed (but not
// a live one: that is another agent), mode 0660.
func Serve(ctx context.Context, path string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	lis, err := unixsock.Listen(path, 0o660)
	if err != nil {
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status server stopped", "err", err)
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
		_ = os.Remove(path)
	}, nil
}
