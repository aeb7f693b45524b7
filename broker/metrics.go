package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// metrics are the broker's Prometheus metrics: every RPC by service, method and code
// (go-grpc-middleware's server metrics, under cablemesh_broker_), the open watch streams, the
// agents holding one, by cluster, and the store's revision.
type metrics struct {
	reg     *prometheus.Registry
	grpc    *grpcprom.ServerMetrics
	watches prometheus.Gauge
	agents  *prometheus.GaugeVec

	mu   sync.Mutex
	open map[string]map[string]int // cluster -> node -> open watch streams
}

var descStoreRevision = prometheus.NewDesc("cablemesh_broker_store_revision",
	"The store's current revision (every change of the mesh's state raises it); read at scrape time.", nil, nil)

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(
			grpcprom.WithServerCounterOptions(grpcprom.WithNamespace("cablemesh"), grpcprom.WithSubsystem("broker")),
			grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramNamespace("cablemesh"), grpcprom.WithHistogramSubsystem("broker"),
				// Admin and agent calls take milliseconds; a watch's "handling time" is its life.
				grpcprom.WithHistogramBuckets([]float64{.001, .005, .025, .1, .5, 2.5, 10, 60, 600, 3600})),
		),
		watches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cablemesh_broker_watch_streams",
			Help: "Agent watch streams open now.",
		}),
		agents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cablemesh_broker_agents_connected",
			Help: "Agents (nodes) of a cluster with at least one open watch stream.",
		}, []string{"cluster"}),
		open: map[string]map[string]int{},
	}
	m.reg.MustRegister(m.grpc, m.watches, m.agents, storeRevision{s})
	return m
}

// watchStream counts an agent's watch while it is open. It runs after authorization, so the
// stream's context names the agent.
func (m *metrics) watchStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod != apiv1.Agent_Watch_FullMethodName {
		return h(srv, ss)
	}
	id := identityFrom(ss.Context())
	m.watchOpened(id.Cluster, id.Node)
	defer m.watchClosed(id.Cluster, id.Node)
	return h(srv, ss)
}

func (m *metrics) watchOpened(cluster, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watches.Inc()
	nodes := m.open[cluster]
	if nodes == nil {
		nodes = map[string]int{}
		m.open[cluster] = nodes
	}
	nodes[node]++
	m.agents.WithLabelValues(cluster).Set(float64(len(nodes)))
}

func (m *metrics) watchClosed(cluster, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watches.Dec()
	nodes := m.open[cluster]
	if nodes[node]--; nodes[node] <= 0 {
		delete(nodes, node)
	}
	if len(nodes) == 0 {
		// A cluster without agents leaves no series behind (it may have been removed).
		delete(m.open, cluster)
		m.agents.DeleteLabelValues(cluster)
		return
	}
	m.agents.WithLabelValues(cluster).Set(float64(len(nodes)))
}

// storeRevision reads the revision at scrape time; a store that does not answer (etcd away)
// leaves the series out of that scrape rather than report a wrong value.
type storeRevision struct{ s *Server }

func (c storeRevision) Describe(ch chan<- *prometheus.Desc) { ch <- descStoreRevision }

func (c storeRevision) Collect(ch chan<- prometheus.Metric) {
	rev, err := c.s.storeRevision(2 * time.Second)
	if err != nil {
		c.s.log.Debug("metrics: store revision not read", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descStoreRevision, prometheus.GaugeValue, float64(rev))
}

func (s *Server) storeRevision(timeout time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var rev uint64
	err := s.store.View(ctx, func(tx store.ReadTx) error {
		rev = tx.Revision()
		return nil
	})
	return rev, err
}

// MetricsHandler serves /metrics, /healthz (the process serves) and /readyz (Serve accepts
// connections and the store answers: an etcd replica that lost etcd is taken out of its Service),
// and with withPprof Go's profiles under /debug/pprof/.
func (s *Server) MetricsHandler(withPprof bool) http.Handler {
	mux := http.NewServeMux()
	if withPprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		select {
		case <-s.ready:
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: the gRPC listener is not serving yet\n")
			return
		}
		rev, err := s.storeRevision(2 * time.Second)
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: the store does not answer: %v\n", err)
			return
		}
		_, _ = fmt.Fprintf(w, "ok: store revision %d\n", rev)
	})
	return mux
}

// ServeMetrics serves MetricsHandler on lis until ctx ends.
func (s *Server) ServeMetrics(ctx context.Context, lis net.Listener, withPprof bool) error {
	srv := &http.Server{Handler: s.MetricsHandler(withPprof), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	s.log.Info("serving metrics", "address", lis.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("metrics listener %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
