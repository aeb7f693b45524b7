package dns

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
)

const (
	// Origin is the clusterset zone, fixed by the MCS API.
	Origin = "clusterset.local."
	// SchemaVersion is the version of the KEP-1645 DNS specification answered by
	// dns-version.clusterset.local TXT.
	SchemaVersion = "1.0.0"
	// DefaultTTL is the TTL of every record but dns-version's, and the SOA's negative TTL.
	DefaultTTL = 5 * time.Second
	// versionTTL is dns-version's TTL, as CoreDNS's multicluster plugin and the spec's example
	// give it: the schema only changes with the agent.
	versionTTL = 28800

	// nsName is the zone's name server, the target of the apex NS record.
	nsName      = "ns.dns." + Origin
	hostmaster  = "hostmaster." + Origin
	svcName     = "svc." + Origin
	versionName = "dns-version." + Origin
	// maxWireName is the longest name, in wire octets, DNS allows.
	maxWireName = 255
)

// ZoneOptions are the settings of a zone that do not come from the services.
type ZoneOptions struct {
	// TTL of the records (rounded down to seconds, at least 1s). Default: DefaultTTL.
	TTL time.Duration
	// Serial is the SOA serial. The server increases it on every update.
	Serial uint32
	// NSAddrs are the addresses of ns.dns.clusterset.local, the name server the apex NS
	// record names (the address the agent's DNS server is reached at). May be empty.
	NSAddrs []netip.Addr
}

// Zone is an immutable, indexed clusterset.local zone: built once from the service imports
// by BuildZone, then answered from by any number of goroutines. Every name is lower case;
// every name that exists (it owns records, or names below it do: an empty non-terminal) has
// a node, so telling NXDOMAIN from NODATA is one map look-up.
type Zone struct {
	ttl    uint32
	serial uint32
	// synced is false only for the zone the server answers from before its first update:
	// what would be NXDOMAIN is then SERVFAIL.
	synced bool
	nodes  map[string]*node
	soa    []mdns.RR
	// services counts the services the zone holds.
	services int
}

// node holds the records of one owner name, each slice clipped (len == cap) so that a
// response that appends to it copies instead of writing into the shared zone.
type node struct {
	a, aaaa, txt, soa []mdns.RR
	srv, srvExtra     []mdns.RR
	ns, nsExtra       []mdns.RR
}

// Serial is the zone's SOA serial.
func (z *Zone) Serial() uint32 { return z.serial }

// Services is the number of services the zone answers for.
func (z *Zone) Services() int { return z.services }

// Names is the number of names in the zone, empty non-terminals included.
func (z *Zone) Names() int { return len(z.nodes) }

// RRs returns a copy of every record of the zone, sorted by owner name then type (the
// additional sections' repetitions excluded). It is for tests, tools and benchmarks, not for
// answering.
func (z *Zone) RRs() []mdns.RR {
	names := make([]string, 0, len(z.nodes))
	for name := range z.nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []mdns.RR
	for _, name := range names {
		n := z.nodes[name]
		for _, set := range [][]mdns.RR{n.soa, n.ns, n.a, n.aaaa, n.txt, n.srv} {
			for _, rr := range set {
				out = append(out, mdns.Copy(rr))
			}
		}
	}
	return out
}

// Exists reports whether name (any case) exists in the zone: it owns records or is an empty
// non-terminal.
func (z *Zone) Exists(name string) bool {
	_, ok := z.nodes[asciiLower(mdns.Fqdn(name))]
	return ok
}

// builder accumulates a zone.
type builder struct {
	z    *Zone
	ttl  uint32
	errs []error
}

// BuildZone builds the zone of services. It is pure: no I/O, no clock. A service, port,
// VIP or endpoint that cannot be put in DNS (a name that is not a DNS label, an unknown
// protocol, a duplicate service) is skipped, and the returned error (errors.Join of one error
// per skipped item, each wrapping ErrInvalidInput and naming the service, field and value)
// says which; the zone is complete without them and is never nil.
func BuildZone(services []Service, opts ZoneOptions) (*Zone, error) {
	ttl := uint32(DefaultTTL / time.Second)
	if opts.TTL > 0 {
		ttl = uint32(max(opts.TTL/time.Second, 1))
	}
	b := &builder{
		z:   &Zone{ttl: ttl, serial: opts.Serial, synced: true, nodes: make(map[string]*node, 4*len(services)+8)},
		ttl: ttl,
	}
	b.apex(opts.NSAddrs)
	seen := make(map[string]bool, len(services))
	for i := range services {
		b.service(&services[i], seen)
	}
	b.finish()
	return b.z, errors.Join(b.errs...)
}

// unsyncedZone is what the server answers from before its first update.
var unsyncedZone = func() *Zone {
	z, _ := BuildZone(nil, ZoneOptions{})
	z.synced = false
	return z
}()

func (b *builder) fail(svc *Service, field, value, reason string) {
	b.errs = append(b.errs, &inputError{service: svc.Namespace + "/" + svc.Name, field: field, value: value, reason: reason})
}

// node returns the node of name, creating it and every missing ancestor up to the origin.
func (b *builder) node(name string) *node {
	if n, ok := b.z.nodes[name]; ok {
		return n
	}
	n := &node{}
	b.z.nodes[name] = n
	for p := name; p != Origin; {
		i := strings.IndexByte(p, '.')
		p = p[i+1:]
		if _, ok := b.z.nodes[p]; ok {
			break
		}
		b.z.nodes[p] = &node{}
	}
	return n
}

func (b *builder) hdr(name string, t uint16, ttl uint32) mdns.RR_Header {
	return mdns.RR_Header{Name: name, Rrtype: t, Class: mdns.ClassINET, Ttl: ttl}
}

func (b *builder) addr(name string, ip netip.Addr) mdns.RR {
	if ip.Is4() {
		return &mdns.A{Hdr: b.hdr(name, mdns.TypeA, b.ttl), A: ip.AsSlice()}
	}
	return &mdns.AAAA{Hdr: b.hdr(name, mdns.TypeAAAA, b.ttl), AAAA: ip.AsSlice()}
}

func (b *builder) addAddr(n *node, name string, ip netip.Addr) {
	if ip.Is4() {
		n.a = append(n.a, b.addr(name, ip))
	} else {
		n.aaaa = append(n.aaaa, b.addr(name, ip))
	}
}

func (b *builder) srv(owner, target string, port uint16) mdns.RR {
	// The weight is set in finish, when the set is complete.
	return &mdns.SRV{Hdr: b.hdr(owner, mdns.TypeSRV, b.ttl), Priority: 0, Port: port, Target: target}
}

// apex adds the SOA, NS, dns-version TXT and the name server's addresses.
func (b *builder) apex(nsAddrs []netip.Addr) {
	apex := b.node(Origin)
	soa := &mdns.SOA{
		Hdr:     b.hdr(Origin, mdns.TypeSOA, b.ttl),
		Ns:      nsName,
		Mbox:    hostmaster,
		Serial:  b.z.serial,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  b.ttl,
	}
	apex.soa = []mdns.RR{soa}
	b.z.soa = apex.soa
	apex.ns = []mdns.RR{&mdns.NS{Hdr: b.hdr(Origin, mdns.TypeNS, b.ttl), Ns: nsName}}
	ns := b.node(nsName)
	seen := map[netip.Addr]bool{}
	for _, ip := range nsAddrs {
		ip, _, ok := normAddr(ip)
		if !ok || seen[ip] {
			continue
		}
		seen[ip] = true
		b.addAddr(ns, nsName, ip)
	}
	apex.nsExtra = append(slices.Clip(ns.a), ns.aaaa...)
	version := b.node(versionName)
	version.txt = []mdns.RR{&mdns.TXT{Hdr: b.hdr(versionName, mdns.TypeTXT, versionTTL), Txt: []string{SchemaVersion}}}
	b.node(svcName)
}

// port is a validated service port.
type port struct {
	name  string // lower case, "" when unnamed
	proto string // tcp, udp or sctp
	num   uint16
}

// srvName is the owner of the port's SRV records: _<port>._<proto>.<svc>.
func (p port) srvName(svc string) string {
	return "_" + p.name + "._" + p.proto + "." + svc
}

func (b *builder) ports(svc *Service) []port {
	var out []port
	for i, p := range svc.Ports {
		field := fmt.Sprintf("ports[%d]", i)
		var name string
		if p.Name != "" {
			n, ok := normLabel(p.Name)
			if !ok {
				b.fail(svc, field+".name", p.Name, labelRule)
				continue
			}
			name = n
		}
		proto, ok := normProtocol(p.Protocol)
		if !ok {
			b.fail(svc, field+".protocol", p.Protocol, "is not TCP, UDP or SCTP")
			continue
		}
		if p.Port == 0 {
			b.fail(svc, field+".port", "0", "is not a port number (1..65535)")
			continue
		}
		np := port{name: name, proto: proto, num: p.Port}
		if !slices.Contains(out, np) {
			out = append(out, np)
		}
	}
	return out
}

func (b *builder) service(svc *Service, seen map[string]bool) {
	ns, ok := normLabel(svc.Namespace)
	if !ok {
		b.fail(svc, "namespace", svc.Namespace, labelRule)
		return
	}
	name, ok := normLabel(svc.Name)
	if !ok {
		b.fail(svc, "name", svc.Name, labelRule)
		return
	}
	if svc.Type != ClusterSetIP && svc.Type != Headless {
		b.fail(svc, "type", svc.Type.String(), "is neither ClusterSetIP nor Headless")
		return
	}
	key := ns + "/" + name
	if seen[key] {
		b.fail(svc, "name", key, "is a duplicate of an earlier service (the first one is answered)")
		return
	}
	seen[key] = true
	b.z.services++
	// The namespace exists once a service is imported into it, even a headless service
	// without ready endpoints (as CoreDNS answers NODATA for an existing namespace).
	nsFQDN := ns + "." + svcName
	b.node(nsFQDN)
	owner := name + "." + nsFQDN
	ports := b.ports(svc)
	if svc.Type == ClusterSetIP {
		b.clusterSetIP(svc, owner, ports)
	} else {
		b.headless(svc, owner, ports)
	}
}

func (b *builder) clusterSetIP(svc *Service, owner string, ports []port) {
	n := b.node(owner)
	seen := map[netip.Addr]bool{}
	for i, vip := range svc.VIPs {
		ip, reason, ok := normAddr(vip)
		if !ok {
			b.fail(svc, fmt.Sprintf("vips[%d]", i), vip.String(), reason)
			continue
		}
		if seen[ip] {
			continue
		}
		seen[ip] = true
		b.addAddr(n, owner, ip)
	}
	n.a, n.aaaa = slices.Clip(n.a), slices.Clip(n.aaaa)
	addrs := slices.Clip(append(slices.Clip(n.a), n.aaaa...))
	for _, p := range ports {
		var pn *node
		var pname string
		if p.name != "" {
			// The SRV name exists even while the service has no VIP yet (NODATA).
			pname = p.srvName(owner)
			pn = b.node(pname)
		}
		if len(addrs) == 0 {
			continue
		}
		n.srv = append(n.srv, b.srv(owner, owner, p.num))
		n.srvExtra = addrs
		if pn != nil {
			pn.srv = append(pn.srv, b.srv(pname, owner, p.num))
			pn.srvExtra = addrs
		}
	}
}

// endpoint is a validated, ready endpoint.
type endpoint struct {
	fqdn string // <hostname>.<clusterid>.<svc>
	ip   netip.Addr
}

func (b *builder) endpoints(svc *Service, owner string) []endpoint {
	var out []endpoint
	for i, ep := range svc.Endpoints {
		field := fmt.Sprintf("endpoints[%d]", i)
		cluster, ok := normLabel(ep.Cluster)
		if !ok {
			b.fail(svc, field+".cluster", ep.Cluster, labelRule)
			continue
		}
		ip, reason, ok := normAddr(ep.IP)
		if !ok {
			b.fail(svc, field+".ip", ep.IP.String(), reason)
			continue
		}
		host := ipLabel(ip)
		if ep.Hostname != "" {
			if host, ok = normLabel(ep.Hostname); !ok {
				b.fail(svc, field+".hostname", ep.Hostname, labelRule)
				continue
			}
		}
		fqdn := host + "." + cluster + "." + owner
		if len(fqdn)+1 > maxWireName {
			b.fail(svc, field, fqdn, fmt.Sprintf("is longer than %d octets", maxWireName))
			continue
		}
		if !ep.Ready {
			continue
		}
		out = append(out, endpoint{fqdn: fqdn, ip: ip})
	}
	slices.SortFunc(out, func(x, y endpoint) int {
		return cmp.Or(strings.Compare(x.fqdn, y.fqdn), x.ip.Compare(y.ip))
	})
	return slices.CompactFunc(out, func(x, y endpoint) bool { return x == y })
}

func (b *builder) headless(svc *Service, owner string, ports []port) {
	eps := b.endpoints(svc, owner)
	if len(eps) == 0 {
		// No ready endpoint: the service name does not exist (NXDOMAIN), as the spec says.
		return
	}
	n := b.node(owner)
	seen := map[netip.Addr]bool{}
	var targets []string // distinct endpoint names, sorted
	for _, ep := range eps {
		if !seen[ep.ip] {
			seen[ep.ip] = true
			b.addAddr(n, owner, ep.ip)
		}
		en := b.node(ep.fqdn)
		b.addAddr(en, ep.fqdn, ep.ip)
		if len(targets) == 0 || targets[len(targets)-1] != ep.fqdn {
			targets = append(targets, ep.fqdn)
		}
	}
	n.a, n.aaaa = slices.Clip(n.a), slices.Clip(n.aaaa)
	if len(ports) == 0 {
		return
	}
	// The additional section of every SRV answer: the targets' addresses.
	var extra []mdns.RR
	for _, t := range targets {
		en := b.z.nodes[t]
		en.a, en.aaaa = slices.Clip(en.a), slices.Clip(en.aaaa)
		extra = append(extra, en.a...)
		extra = append(extra, en.aaaa...)
		// An SRV query for an endpoint's own name lists its ports, as CoreDNS answers.
		for _, p := range ports {
			en.srv = append(en.srv, b.srv(t, t, p.num))
		}
		en.srvExtra = slices.Clip(append(slices.Clip(en.a), en.aaaa...))
	}
	extra = slices.Clip(extra)
	for _, p := range ports {
		var pn *node
		var pname string
		if p.name != "" {
			pname = p.srvName(owner)
			pn = b.node(pname)
			pn.srvExtra = extra
		}
		for _, t := range targets {
			n.srv = append(n.srv, b.srv(owner, t, p.num))
			if pn != nil {
				pn.srv = append(pn.srv, b.srv(pname, t, p.num))
			}
		}
	}
	n.srvExtra = extra
}

// finish sets SRV weights (each record of a set gets an equal share of 100, at least 1, as
// CoreDNS does) and clips every slice.
func (b *builder) finish() {
	type key struct {
		target string
		port   uint16
	}
	seen := map[key]bool{}
	for _, n := range b.z.nodes {
		if len(n.srv) > 1 {
			// SRV records carry no protocol: dns/UDP/53 and dns/TCP/53 are one record.
			clear(seen)
			n.srv = slices.DeleteFunc(n.srv, func(rr mdns.RR) bool {
				k := key{rr.(*mdns.SRV).Target, rr.(*mdns.SRV).Port}
				dup := seen[k]
				seen[k] = true
				return dup
			})
		}
		if len(n.srv) > 0 {
			w := uint16(max(100/len(n.srv), 1))
			for _, rr := range n.srv {
				rr.(*mdns.SRV).Weight = w
			}
		}
		n.a, n.aaaa, n.srv = slices.Clip(n.a), slices.Clip(n.aaaa), slices.Clip(n.srv)
	}
}
