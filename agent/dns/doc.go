// Package dns is the cable-agent's DNS server for the clusterset.local zone: the records of
// the Kubernetes Multicluster Services DNS specification (KEP-1645, schema 1.0.0), answered
// as CoreDNS's multicluster plugin answers them, with every other name forwarded upstream.
//
// # Shape
//
// The core is pure: BuildZone turns the service imports ([]Service) into an immutable,
// indexed Zone (every existing name, empty non-terminals included, is one map key, so
// telling NXDOMAIN from NODATA is one look-up), and Answer(zone, request) returns the
// response. Server is the thin shell: it listens on UDP and TCP, swaps the zone atomically
// on Update, forwards names outside the zone, and fits each response to its transport
// (truncated with TC over UDP beyond the client's EDNS0 size, 512 bytes without EDNS0, and
// never beyond MaxUDPResponse, 1232 bytes, whatever size the client asks for).
//
// # Clients
//
// The server answers its node's clients only: loopback, the node's own addresses (re-read at
// most once a second when an unknown source asks), and Config.Clients, which the agent sets to
// the cluster's pod and service CIDRs plus dns.allowClients (SetClients, as the broker's record
// of the cluster arrives or a reload changes them). Any other source gets an empty REFUSED, for
// clusterset.local names as for forwarded ones: the zone lists the mesh's VIPs and endpoints,
// which are the cluster's business, and a REFUSED answer is never larger than the query, so the
// server amplifies nothing to a spoofed source. Over UDP every answer is cut at 1232 bytes with
// TC set (the client asks again over TCP, RFC 7766); the OPT record advertises 1232 as the
// server's own size (RFC 6891). A wildcard dns.listen (0.0.0.0, ::) is accepted with a
// warning, logged and shown in status (dns.warnings): it also listens on the underlay.
//
// # Records
//
//	dns-version.clusterset.local.               TXT "1.0.0" (TTL 28800, as CoreDNS)
//	clusterset.local.                           SOA ns.dns.clusterset.local. hostmaster.clusterset.local. <serial> 7200 1800 86400 <ttl>
//	clusterset.local.                           NS  ns.dns.clusterset.local. (A/AAAA: Config.NSAddrs)
//	<svc>.<ns>.svc.clusterset.local.            ClusterSetIP: A/AAAA of the VIPs; Headless: A/AAAA of every ready endpoint
//	_<port>._<proto>.<svc>.<ns>.svc...          SRV per named port: target the service (ClusterSetIP) or each ready endpoint (Headless)
//	<svc>.<ns>.svc... SRV                       every port, named or not (as CoreDNS), same targets
//	<hostname>.<clusterid>.<svc>.<ns>.svc...    Headless, per ready endpoint: A/AAAA (and SRV of its ports, as CoreDNS)
//
// An endpoint without hostname is named after its IP with '.' or ':' replaced by '-'
// (10-1-2-3, fd00--1). SRV answers carry the targets' addresses in the additional section;
// SRV priority is 0 and each record of a set weighs 100/n. Every record has the TTL (default
// 5s); the SOA's minimum (the negative-caching TTL) is the same. Names are case-insensitive;
// answers are owned by the question's name as asked.
//
// # NXDOMAIN and NODATA
//
// Every negative answer is authoritative and carries the zone's SOA in the authority
// section. answer_test.go's TestAnswer is the full table; in short:
//
//	name                                              query           answer
//	dns-version.clusterset.local                      TXT             "1.0.0"
//	dns-version.clusterset.local                      A               NODATA
//	clusterset.local (apex)                           SOA, NS         the SOA, the NS (+ glue)
//	clusterset.local, svc.clusterset.local            A               NODATA (empty non-terminals)
//	<ns>.svc.clusterset.local, ns has imports          A               NODATA (empty non-terminal)
//	<ns>.svc.clusterset.local, no imports              A               NXDOMAIN
//	pod.clusterset.local, anything else under apex    any             NXDOMAIN
//	unknown <svc>.<ns>.svc.clusterset.local           any             NXDOMAIN
//	ClusterSetIP service, IPv4 VIP only               AAAA            NODATA
//	ClusterSetIP service                              TXT, MX, ANY    NODATA (ANY as CoreDNS)
//	ClusterSetIP service without a VIP yet            A, SRV          NODATA
//	_<port>._<proto>.<svc>, named port                A               NODATA
//	_<port>._<otherproto>.<svc>, unknown port name    SRV             NXDOMAIN
//	_<proto>.<svc> above a named port                 any             NODATA (empty non-terminal)
//	<clusterid>.<svc>, ClusterSetIP service           any             NXDOMAIN (spec 2.3.4)
//	<hostname>.<clusterid>.<svc>, ClusterSetIP        any             NXDOMAIN
//	Headless service, no ready endpoint               any             NXDOMAIN (spec 2.4.1), its SRV names too
//	Headless service, ready IPv4 endpoints only       AAAA            NODATA
//	<clusterid>.<svc>, Headless, ready endpoints there any            NODATA (empty non-terminal, RFC 8020)
//	<clusterid>.<svc>, Headless, none ready there     any             NXDOMAIN
//	<hostname>.<clusterid>.<svc>, endpoint not ready  any             NXDOMAIN
//	any zone name, before the first Update            would-be NXDOMAIN  SERVFAIL (as CoreDNS before sync)
//	AXFR/IXFR, or a class other than IN/ANY           any             REFUSED
//	a name outside clusterset.local                   any             forwarded; REFUSED without upstream
//	any name, from a source that is no client         any             REFUSED
//
// Where the tree of names and CoreDNS's multicluster plugin differ, this package follows the
// tree (RFC 8020: a name with names below it exists), because resolvers that minimise query
// names (RFC 9156) would otherwise conclude from an NXDOMAIN that the endpoint below does
// not exist either:
//
//   - <clusterid>.<svc>... of a headless service with ready endpoints in that cluster, and
//     _<proto>.<svc>... above a named port: NODATA (CoreDNS: NXDOMAIN, its parser rejects
//     four-label names).
//   - An A query for _<port>._<proto>.<svc>...: NODATA (CoreDNS answers the VIP, reading the
//     SRV labels as a filter).
//   - pod.clusterset.local: NXDOMAIN (CoreDNS: NODATA); the multicluster schema has no pod
//     records.
//   - The apex answers NS (CoreDNS's multicluster plugin: NODATA, "TODO support TypeNS").
//   - A namespace exists when a service is imported into it (CoreDNS asks the local API
//     server for Namespace objects).
//   - A ClusterSetIP service without ports still answers A/AAAA (CoreDNS: NXDOMAIN, its
//     look-up walks the ports).
//   - No wildcard ("*", "any") labels; they are deprecated in CoreDNS's kubernetes plugin.
//   - No PTR records (spec 2.3.3/2.4.3): reverse names are outside clusterset.local and are
//     forwarded.
//
// # Forwarding
//
// Names outside clusterset.local go to Config.Upstreams in order (ip, ip:port or a
// resolv.conf path): over UDP with the client's EDNS0 record as is, again over TCP when the
// answer is truncated (or directly over TCP for a TCP client), each exchange bounded by
// UpstreamTimeout and the whole query by 5s. No upstream answering: SERVFAIL. No upstream
// configured: REFUSED. More than MaxForwards in flight: REFUSED, as CoreDNS's forward plugin
// does. Zone names are never forwarded, so the server cannot loop through CoreDNS.
//
// # Kubernetes: CoreDNS stanza
//
// Pods resolve clusterset.local through the cluster's CoreDNS, which forwards the zone to the
// agent, as Kuma does for .kuma. Add to the coredns ConfigMap's Corefile:
//
//	clusterset.local:53 {
//	    errors
//	    cache 5
//	    loadbalance
//	    forward . <agent DNS address>   # e.g. the ClusterIP of a Service in front of the agents' dns.listen
//	}
//
// cache 5 matches the records' TTL; loadbalance rotates the addresses of headless services
// (this server answers them in a stable order). On Universal hosts, point the host's resolver
// at dns.listen for the zone (systemd-resolved: a DNS= and Domains=~clusterset.local link, or
// dnsmasq's server=/clusterset.local/<addr>), or make the agent the resolver and give it an
// upstream.
//
// # Wiring (for the agent)
//
// Build a Server from the dns.* settings, Run it under the agent's context, and call Update
// with every service import whenever imports, endpoints or connection states change; an
// endpoint of a cluster whose connection is down is passed with Ready false (or left out),
// so that cluster stops being answered. Update's error lists the inputs it left out; log it,
// it never stops the others being served. Call Update as soon as the cached broker state is
// loaded: until the first Update, names in the zone are SERVFAIL.
package dns
