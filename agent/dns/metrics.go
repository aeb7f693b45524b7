package dns

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus metrics, registered only when Config.Registerer is set.
type metrics struct {
	requests         *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	upstreamFailures *prometheus.CounterVec
	zoneServices     prometheus.Gauge
	zoneNames        prometheus.Gauge
	updateSkipped    prometheus.Counter
	rcodes           [24]string // label values of the rcodes, computed once
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cablemesh_dns_requests_total",
			Help: "DNS requests answered, by source (zone: clusterset.local; upstream: forwarded) and response code.",
		}, []string{"source", "rcode"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cablemesh_dns_request_duration_seconds",
			Help:    "Time from receiving a DNS request to writing its response, by source.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"source"}),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cablemesh_dns_upstream_failures_total",
			Help: "Exchanges with an upstream server that failed (timeout, network error, mismatched answer).",
		}, []string{"upstream"}),
		zoneServices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cablemesh_dns_zone_services",
			Help: "Services in the clusterset.local zone being answered.",
		}),
		zoneNames: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cablemesh_dns_zone_names",
			Help: "Names (empty non-terminals included) in the clusterset.local zone being answered.",
		}),
		updateSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cablemesh_dns_update_skipped_total",
			Help: "Services, ports, VIPs and endpoints left out of the zone because they cannot be put in DNS.",
		}),
	}
	for i := range m.rcodes {
		if s, ok := mdns.RcodeToString[i]; ok {
			m.rcodes[i] = s
		} else {
			m.rcodes[i] = strconv.Itoa(i)
		}
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.upstreamFailures, m.zoneServices, m.zoneNames, m.updateSkipped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register dns metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(source string, rcode int, d time.Duration) {
	rc := strconv.Itoa(rcode)
	if rcode >= 0 && rcode < len(m.rcodes) {
		rc = m.rcodes[rcode]
	}
	m.requests.WithLabelValues(source, rc).Inc()
	m.duration.WithLabelValues(source).Observe(d.Seconds())
}

func (m *metrics) observeUpdate(z *Zone, err error) {
	m.zoneServices.Set(float64(z.Services()))
	m.zoneNames.Set(float64(z.Names()))
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		m.updateSkipped.Add(float64(len(joined.Unwrap())))
	}
}
