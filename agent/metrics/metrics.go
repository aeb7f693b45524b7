// Package metrics is the agent's Prometheus metrics, its /healthz and /readyz, and the
// readiness they report.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
)

// Serve serves, on addr (metricsAddress), Prometheus metrics on metricsAddress at /metrics, and the probes /healthz
// and /readyz.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metricsAddress %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "address", lis.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}

// Handler serves /metrics, /healthz and /readyz.
func Handler(reg *prometheus.Registry, ready *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Liveness: the process serves. Nothing else is asked of it: a broker outage or a failed
	// tunnel is no reason to restart an agent that keeps the last state (DESIGN.md, Sync).
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	// Readiness: true once the agent has applied a full state, the broker's snapshot or its
	// cached copy, and stays true through broker outages (cilium/cilium#43561: a pod marked ready
	// before its first sync took traffic it could not route; one marked unready when the broker
	// went away rolled a DaemonSet for nothing).
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ok, rev := ready.Synced()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: no full sync yet (no broker snapshot received and no cached state applied)\n")
			return
		}
		_, _ = fmt.Fprintf(w, "ok: synced at broker revision %d\n", rev)
	})
	return mux
}

// Readiness records the first reconcile pass over a full state.
type Readiness struct {
	Log      *slog.Logger
	synced   atomic.Bool
	revision atomic.Uint64 // the revision of that first pass
}

// Mark is called after every reconcile pass with the revision of the state it planned
// from. A revision above 0 means a full state: the agent loads a cached state whole, and without
// one it asks the broker from revision 0, which answers with a snapshot; deltas only ever come on
// top of one of the two.
func (r *Readiness) Mark(rev uint64) {
	if rev == 0 || r.synced.Load() {
		return
	}
	r.revision.Store(rev)
	r.synced.Store(true)
	if r.Log != nil {
		r.Log.Info("first full sync applied: ready", "revision", rev)
	}
}

// Synced reports whether the agent is ready (/readyz), and the broker revision it became ready at.
func (r *Readiness) Synced() (bool, uint64) {
	return r.synced.Load(), r.revision.Load()
}

var (
	descState = prometheus.NewDesc("cablemesh_agent_connection_state",
		"1 for the state a connection to a remote cluster is in (read from the device), 0 for the others.",
		[]string{"cluster", "driver", "state"}, nil)
	descRx = prometheus.NewDesc("cablemesh_agent_connection_rx_bytes_total",
		"Bytes received from a remote cluster over its connection, as the device counts them.",
		[]string{"cluster", "driver"}, nil)
	descTx = prometheus.NewDesc("cablemesh_agent_connection_tx_bytes_total",
		"Bytes sent to a remote cluster over its connection, as the device counts them.",
		[]string{"cluster", "driver"}, nil)
	descBroker = prometheus.NewDesc("cablemesh_agent_broker_connected",
		"1 when the agent's watch (and, on gateways, heartbeat) to the broker is working.", nil, nil)
	descRevision = prometheus.NewDesc("cablemesh_agent_broker_revision",
		"The last broker revision the agent applied.", nil, nil)
	descCertExpiry = prometheus.NewDesc("cablemesh_agent_certificate_expiry_timestamp_seconds",
		"When the agent's certificate expires (Unix time); it renews two thirds into its lifetime, so an expiry less than a third of a lifetime away means renewals fail.", nil, nil)
	descHealthy = prometheus.NewDesc("cablemesh_agent_connection_healthy",
		"1 when the health probes to a remote cluster's gateway answer, 0 after healthCheck.failureThreshold failures in a row (only for probed connections).",
		[]string{"cluster", "driver"}, nil)
)

// Collector reads the same status the socket serves at scrape time, so metrics and
// `cablectl status` never disagree: the connections, the broker link and the certificate, and
// the probes' own metrics.
type Collector struct {
	Status func(context.Context) statusapi.Status
	Probes *Probes
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descRx, descTx, descBroker, descRevision, descHealthy, descCertExpiry} {
		ch <- d
	}
	c.Probes.describe(ch)
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := c.Status(ctx)
	for _, conn := range s.Connections {
		for _, st := range []cable.State{cable.StateConnected, cable.StateConnecting, cable.StateError} {
			v := 0.0
			if conn.State == string(st) {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, conn.Cluster, conn.Driver, string(st))
		}
		ch <- prometheus.MustNewConstMetric(descRx, prometheus.CounterValue, float64(conn.RxBytes), conn.Cluster, conn.Driver)
		ch <- prometheus.MustNewConstMetric(descTx, prometheus.CounterValue, float64(conn.TxBytes), conn.Cluster, conn.Driver)
		if h := conn.Health; h != nil && h.Probing {
			v := 0.0
			if h.Healthy {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, v, conn.Cluster, conn.Driver)
		}
	}
	c.Probes.collect(ch)
	b := 0.0
	if s.Broker.Connected {
		b = 1
	}
	ch <- prometheus.MustNewConstMetric(descBroker, prometheus.GaugeValue, b)
	ch <- prometheus.MustNewConstMetric(descRevision, prometheus.GaugeValue, float64(s.Broker.Revision))
	if t := s.Broker.CertificateNotAfter; t != nil {
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(t.Unix()))
	}
}

// Probes are the probe metrics. They are observed as probes happen (a histogram cannot be
// rebuilt at scrape time) and served by the agent's collector next to the status-derived ones.
type Probes struct {
	rtt      *prometheus.HistogramVec
	probes   *prometheus.CounterVec
	failures *prometheus.CounterVec
}

func NewProbes() *Probes {
	return &Probes{
		rtt: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cablemesh_agent_connection_rtt_seconds",
			Help: "Round-trip time of the health probes (ICMP echo) to a remote cluster's gateway through its tunnel.",
			// From a tenth of a millisecond (namespaces on one host) to the probe timeout's range.
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"cluster"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cablemesh_agent_probes_total",
			Help: "Health probes sent to a remote cluster's gateway.",
		}, []string{"cluster"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cablemesh_agent_probe_failures_total",
			Help: "Health probes to a remote cluster's gateway that got no answer in time or could not be sent.",
		}, []string{"cluster"}),
	}
}

// Observe implements health.Observer.
func (m *Probes) Observe(cluster string, rtt time.Duration, err error) {
	m.probes.WithLabelValues(cluster).Inc()
	if err != nil {
		m.failures.WithLabelValues(cluster).Inc()
		return
	}
	m.rtt.WithLabelValues(cluster).Observe(rtt.Seconds())
}

// Forget implements health.Observer: a cluster no longer probed leaves no stale series.
func (m *Probes) Forget(cluster string) {
	m.rtt.DeleteLabelValues(cluster)
	m.probes.DeleteLabelValues(cluster)
	m.failures.DeleteLabelValues(cluster)
}

func (m *Probes) describe(ch chan<- *prometheus.Desc) {
	m.rtt.Describe(ch)
	m.probes.Describe(ch)
	m.failures.Describe(ch)
}

func (m *Probes) collect(ch chan<- prometheus.Metric) {
	m.rtt.Collect(ch)
	m.probes.Collect(ch)
	m.failures.Collect(ch)
}
