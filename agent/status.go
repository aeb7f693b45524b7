package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/preflight"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/internal/version"
)

// Status builds the status document from what each component contributes; a gateway's
// connection rows come from the cables (cables.Cables.Status).
func (a *Agent) Status(ctx context.Context) statusapi.Status {
	p := a.plan()
	st := p.State
	out := statusapi.Status{Cluster: a.cfg.Cluster, Node: a.cfg.Node, Gateway: a.cfg.Gateway, Version: version.String(),
		Connections: []statusapi.Connection{}}
	if c := st.Clusters[a.cfg.Cluster]; c != nil {
		out.ClusterID = c.GetId()
	} else if c := a.localCluster(); c != nil {
		out.ClusterID = c.GetId()
	}
	out.Problems = append(out.Problems, a.link.Status(&out.Broker)...)
	out.Problems = append(out.Problems, a.clusterPolicies.Problems()...)
	if p := preflight.TokenFileProblem(a.liveConfig().JoinTokenFile); p != "" {
		out.Problems = append(out.Problems, statusapi.Problem{Message: p})
	}
	out.Config = a.reload.Status()
	out.Problems = append(out.Problems, a.reload.Problems()...)
	out.Services = a.servicesStatus()
	a.ingress.Status(&out)
	if !a.cfg.Gateway {
		// The routes via the gateway leave out what the guard refuses too.
		out.Problems = append(out.Problems, cables.StatusProblems(p.Problems)...)
		out.Worker = a.worker.Status(p)
		return out
	}
	a.cables.Status(ctx, p, &out, a.liveConfig().CableDrivers, a.datapath().Traffic())
	return out
}

type server struct{ close func() }

// serveStatus listens on the status socket: parent dir created, a stale socket removed (but not
// a live one: that is another agent), mode 0660.
func (a *Agent) serveStatus(ctx context.Context) (*server, error) {
	path := a.cfg.StatusSocket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("statusSocket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, 300*time.Millisecond); err == nil {
			c.Close()
			return nil, fmt.Errorf("statusSocket %s: another process is serving on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("statusSocket %s: remove stale socket: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.Path, func(w http.ResponseWriter, r *http.Request) {
		statusapi.WriteJSON(w, http.StatusOK, a.Status(r.Context()))
	})
	mux.HandleFunc("GET "+statusapi.ServicesPath, func(w http.ResponseWriter, r *http.Request) {
		statusapi.WriteJSON(w, http.StatusOK, a.servicesStatus())
	})
	a.exports.Routes(mux)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("status server stopped", "err", err)
		}
	}()
	return &server{close: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
		_ = os.Remove(path)
	}}, nil
}
