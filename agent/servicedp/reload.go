package servicedp

import (
	"errors"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/dns"
)

// errNoDNS is why a DNS change has nothing to apply to.
var errNoDNS = errors.New("no DNS server runs (dns.listen is empty)")

// DNS is the DNS server; nil when dns.listen is empty or before Start.
func (d *Datapath) DNS() *dns.Server {
	if d == nil {
		return nil
	}
	return d.dns
}

// ApplyConfig is the datapath's part of a live config change: the DNS server takes the reloaded
// upstreams, TTL and clients, and serves its records again with the new TTL. The load balancer
// and the counters have no live setting.
func (d *Datapath) ApplyConfig(next config.Live) {
	if d == nil {
		return
	}
	if d.dns == nil {
		d.log.Warn("dns settings not applied", "err", errNoDNS)
		return
	}
	if err := d.dns.SetForwarding(next.DNS.Upstream, time.Duration(next.DNS.TTL)*time.Second); err != nil {
		d.log.Error("dns settings not applied", "err", err)
		return
	}
	d.dns.SetClients(d.dnsClients(next.DNS))
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dnsUpdated {
		// Errors were reported when these records were first served; the TTL changes none.
		_ = d.dns.Update(d.lastDNS)
	}
}
