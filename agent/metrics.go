package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cablemesh/cablemesh/cable"
)

// serveMetrics serves Prometheus metrics on metricsAddress at /metrics.
func (a *Agent) serveMetrics(ctx context.Context) (*server, error) {
	reg := a.registry
	lis, err := net.Listen("tcp", a.cfg.MetricsAddress)
	if err != nil {
		return nil, fmt.Errorf("metricsAddress %s: %w", a.cfg.MetricsAddress, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server stopped", "err", err)
		}
	}()
	a.log.Info("serving metrics", "address", lis.Addr().String())
	return &server{close: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}}, nil
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

// collector reads the same status the socket serves at scrape time, so metrics and
// `cablectl status` never disagree.
type collector struct{ a *Agent }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descRx, descTx, descBroker, descRevision, descHealthy, descCertExpiry} {
		ch <- d
	}
	c.a.metrics.describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := c.a.Status(ctx)
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
	c.a.metrics.collect(ch)
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

// healthMetrics are the probe metrics. They are observed as probes happen (a histogram cannot be
// rebuilt at scrape time) and served by the agent's collector next to the status-derived ones.
type healthMetrics struct {
	rtt      *prometheus.HistogramVec
	probes   *prometheus.CounterVec
	failures *prometheus.CounterVec
}

func newHealthMetrics() *healthMetrics {
	return &healthMetrics{
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
func (m *healthMetrics) Observe(cluster string, rtt time.Duration, err error) {
	m.probes.WithLabelValues(cluster).Inc()
	if err != nil {
		m.failures.WithLabelValues(cluster).Inc()
		return
	}
	m.rtt.WithLabelValues(cluster).Observe(rtt.Seconds())
}

// Forget implements health.Observer: a cluster no longer probed leaves no stale series.
func (m *healthMetrics) Forget(cluster string) {
	m.rtt.DeleteLabelValues(cluster)
	m.probes.DeleteLabelValues(cluster)
	m.failures.DeleteLabelValues(cluster)
}

func (m *healthMetrics) describe(ch chan<- *prometheus.Desc) {
	m.rtt.Describe(ch)
	m.probes.Describe(ch)
	m.failures.Describe(ch)
}

func (m *healthMetrics) collect(ch chan<- prometheus.Metric) {
	m.rtt.Collect(ch)
	m.probes.Collect(ch)
	m.failures.Collect(ch)
}
