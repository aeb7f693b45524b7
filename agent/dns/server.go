package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultUpstreamTimeout = 2 * time.Second
	DefaultMaxForwards     = 1000
	// forwardBudget bounds one forwarded query across all upstreams and both transports.
	forwardBudget = 5 * time.Second
	// MaxUDPResponse caps every UDP response, whatever EDNS0 size the client asks for: the
	// DNS flag day 2020 size, below any path MTU, so an answer is never fragmented and a
	// small query can never buy a large answer (amplification). Longer answers are truncated
	// with TC set, and the client retries over TCP (RFC 7766).
	MaxUDPResponse = 1232
	// localAddrsRefresh bounds how often an unknown source makes the server re-read the
	// node's addresses: a flood of outside sources costs at most one read per period.
	localAddrsRefresh = time.Second
)

// Config configures a Server. Its fields are the agent's dns.* settings.
type Config struct {
	// Listen is the address (ip:port) the server answers on, over UDP and TCP. Port 0 picks
	// a free port (tests); Addr tells which. Required.
	Listen string
	// Upstreams are the servers names outside clusterset.local are forwarded to, ip or
	// ip:port (port 53 by default), tried in order; or the absolute path of a resolv.conf
	// whose nameservers are used. Empty: such names are REFUSED.
	Upstreams []string
	// UpstreamTimeout bounds one exchange with one upstream. Default: 2s.
	UpstreamTimeout time.Duration
	// MaxForwards bounds the forwarded queries in flight; one more is REFUSED (as CoreDNS's
	// forward max_concurrent does). Default: 1000.
	MaxForwards int
	// TTL of the zone's records. Default: 5s.
	TTL time.Duration
	// NSAddrs are the addresses of the zone's name server ns.dns.clusterset.local (the apex
	// NS record's glue). Default: Listen's IP when it is not unspecified.
	NSAddrs []netip.Addr
	// Clients are the sources the server answers besides loopback and the node's own
	// addresses: the cluster's pod and service CIDRs (SetClients replaces them as the agent
	// learns them) and the operator's dns.allowClients. Any other source is REFUSED, for
	// clusterset.local and forwarded names alike: the server is a resolver for its node's
	// workloads, not an open one.
	Clients []netip.Prefix
	// LocalAddrs lists the node's own addresses (sources always answered). Default: the
	// addresses of every interface (net.InterfaceAddrs).
	LocalAddrs func() ([]netip.Addr, error)
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the server's Prometheus metrics (cablemesh_dns_*).
	Registerer prometheus.Registerer
	// BindRetry is how long Start keeps trying to listen while the address is in use, with
	// backoff, logging every failure: an agent started again right after it was killed finds
	// its predecessor's sockets still open until that process is gone. Default:
	// DefaultBindRetry; negative: fail at the first "address already in use".
	BindRetry time.Duration
}

// DefaultBindRetry is Config.BindRetry's default: far longer than a killed process takes to
// release its sockets, short enough that an address held by something else is reported soon.
const DefaultBindRetry = 15 * time.Second

// Server is the agent's clusterset.local DNS server: a thin shell over Answer. It answers
// from the zone of the last Update, swapped atomically, so queries never wait for an update
// nor see half of one; it forwards other names upstream.
type Server struct {
	cfg       Config
	log       *slog.Logger
	upstreams atomic.Pointer[[]string] // swapped by SetForwarding while queries read it
	fwdSlots  chan struct{}
	metrics   *metrics

	zone   atomic.Pointer[Zone]
	update sync.Mutex // serialises Update so serials and swaps stay in order
	serial uint32

	udpClient, tcpClient *mdns.Client

	clients  atomic.Pointer[[]netip.Prefix] // swapped by SetClients while queries read it
	local    atomic.Pointer[localAddrs]
	localMu  sync.Mutex // one re-read of the node's addresses at a time
	warnings []string   // fixed at NewServer

	// ctx is cancelled by Shutdown: it ends the forwarded queries in flight.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	state   int // stateNew, stateStarted, stateStopped
	addr    netip.AddrPort
	servers []*mdns.Server
	done    chan struct{} // closed when every serve goroutine has returned
}

const (
	stateNew      = iota
	stateStarting // Start is waiting for the address (Config.BindRetry)
	stateStarted
	stateStopped
)

// NewServer validates cfg and returns a server that does not listen yet: Start or Run it.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		return nil, errors.New("dns.listen: no address")
	}
	ap, err := netip.ParseAddrPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("dns.listen: %q is not ip:port: %w", cfg.Listen, err)
	}
	if cfg.UpstreamTimeout < 0 || cfg.TTL < 0 || cfg.MaxForwards < 0 {
		return nil, fmt.Errorf("dns: negative upstreamTimeout %s, ttl %s or maxForwards %d", cfg.UpstreamTimeout, cfg.TTL, cfg.MaxForwards)
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.MaxForwards == 0 {
		cfg.MaxForwards = DefaultMaxForwards
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("dns.ttl: %s is shorter than 1s", cfg.TTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BindRetry == 0 {
		cfg.BindRetry = DefaultBindRetry
	}
	if len(cfg.NSAddrs) == 0 && !ap.Addr().IsUnspecified() {
		cfg.NSAddrs = []netip.Addr{ap.Addr()}
	}
	if cfg.LocalAddrs == nil {
		cfg.LocalAddrs = interfaceAddrs
	}
	ups, err := parseUpstreams(cfg.Upstreams)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		fwdSlots:  make(chan struct{}, cfg.MaxForwards),
		udpClient: &mdns.Client{Net: "udp", Timeout: cfg.UpstreamTimeout, UDPSize: mdns.MaxMsgSize},
		tcpClient: &mdns.Client{Net: "tcp", Timeout: cfg.UpstreamTimeout},
	}
	s.upstreams.Store(&ups)
	s.SetClients(cfg.Clients)
	s.local.Store(&localAddrs{})
	if ap.Addr().IsUnspecified() {
		w := fmt.Sprintf("dns.listen %s is a wildcard address: the server listens on every address of the node, the underlay's too "+
			"(it answers only its clients: the cluster's pod and service CIDRs, dns.allowClients, the node and loopback); "+
			"prefer the node's pod-facing address", cfg.Listen)
		s.warnings = append(s.warnings, w)
		cfg.Logger.Warn("DNS SERVER LISTENS ON A WILDCARD ADDRESS", "listen", cfg.Listen, "warning", w)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.Registerer != nil {
		if s.metrics, err = newMetrics(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// parseUpstreams turns dns.upstream entries into ip:port addresses.
func parseUpstreams(in []string) ([]string, error) {
	var out []string
	for i, u := range in {
		if len(u) > 0 && u[0] == '/' {
			rc, err := mdns.ClientConfigFromFile(u)
			if err != nil {
				return nil, fmt.Errorf("dns.upstream[%d]: read %s: %w", i, u, err)
			}
			for _, s := range rc.Servers {
				a, err := netip.ParseAddr(s)
				if err != nil {
					return nil, fmt.Errorf("dns.upstream[%d]: %s: nameserver %q is not an IP address", i, u, s)
				}
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
			continue
		}
		if a, err := netip.ParseAddr(u); err == nil {
			out = append(out, netip.AddrPortFrom(a, 53).String())
			continue
		}
		ap, err := netip.ParseAddrPort(u)
		if err != nil || ap.Port() == 0 {
			return nil, fmt.Errorf("dns.upstream[%d]: %q is not ip, ip:port or the path of a resolv.conf", i, u)
		}
		out = append(out, ap.String())
	}
	return out, nil
}

// Update replaces the zone with the one of services. Queries answer from the old zone until
// the new one is complete, then from the new one. Services, ports, VIPs and endpoints that
// cannot be put in DNS are left out; the error (wrapping ErrInvalidInput) names each. The
// first Update ends the SERVFAIL answers of a server that has no state yet.
func (s *Server) Update(services []Service) error {
	s.update.Lock()
	defer s.update.Unlock()
	s.serial = max(s.serial+1, uint32(time.Now().Unix()))
	z, err := BuildZone(services, ZoneOptions{TTL: s.cfg.TTL, Serial: s.serial, NSAddrs: s.cfg.NSAddrs})
	s.zone.Store(z)
	if s.metrics != nil {
		s.metrics.observeUpdate(z, err)
	}
	return err
}

// ups are the upstreams queries are forwarded to now.
func (s *Server) ups() []string { return *s.upstreams.Load() }

// Upstreams are the ip:port addresses queries outside the zone are forwarded to now.
func (s *Server) Upstreams() []string { return slices.Clone(s.ups()) }

// SetForwarding changes the upstreams and the records' TTL of a running server (a config
// reload): forwarded queries use the new upstreams at once, and the next Update builds the zone
// with the new TTL (ttl 0: the default). Bad input changes nothing.
func (s *Server) SetForwarding(upstreams []string, ttl time.Duration) error {
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Second {
		return fmt.Errorf("dns.ttl: %s is shorter than 1s", ttl)
	}
	ups, err := parseUpstreams(upstreams)
	if err != nil {
		return err
	}
	s.update.Lock()
	defer s.update.Unlock()
	s.cfg.TTL = ttl
	s.upstreams.Store(&ups)
	s.log.Info("dns forwarding changed", "upstreams", ups, "ttl", ttl)
	return nil
}

// Warnings are the server's configuration warnings (a wildcard listen address), for status.
func (s *Server) Warnings() []string { return slices.Clone(s.warnings) }

// SetClients replaces the prefixes whose sources the server answers (besides loopback and the
// node's own addresses). Invalid prefixes are skipped.
func (s *Server) SetClients(prefixes []netip.Prefix) {
	out := make([]netip.Prefix, 0, len(prefixes))
	for _, p := range prefixes {
		if p.IsValid() {
			out = append(out, p.Masked())
		}
	}
	s.clients.Store(&out)
}

// Clients are the prefixes whose sources the server answers now (besides loopback and the
// node's own addresses).
func (s *Server) Clients() []netip.Prefix { return slices.Clone(*s.clients.Load()) }

// localAddrs is a snapshot of the node's addresses and when it was read.
type localAddrs struct {
	addrs map[netip.Addr]bool
	read  time.Time
}

// interfaceAddrs are the addresses of every interface of this network namespace.
func interfaceAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, a := range ifas {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

// ClientAllowed reports whether the server answers queries from src: loopback, the node's own
// addresses and the Clients prefixes.
func (s *Server) ClientAllowed(src netip.Addr) bool {
	src = src.Unmap().WithZone("")
	if !src.IsValid() {
		return false
	}
	if src.IsLoopback() {
		return true
	}
	for _, p := range *s.clients.Load() {
		if p.Contains(src) {
			return true
		}
	}
	return s.isLocal(src)
}

// isLocal reports whether addr is one of the node's addresses, re-reading them (at most once
// per localAddrsRefresh) when addr is not in the last snapshot: an address added since is
// found, and a flood of outside sources costs one read per period.
func (s *Server) isLocal(addr netip.Addr) bool {
	if la := s.local.Load(); la.addrs[addr] || time.Since(la.read) < localAddrsRefresh {
		return la.addrs[addr]
	}
	s.localMu.Lock()
	defer s.localMu.Unlock()
	la := s.local.Load()
	if time.Since(la.read) >= localAddrsRefresh {
		addrs, err := s.cfg.LocalAddrs()
		if err != nil {
			s.log.Debug("dns: read the node's addresses", "err", err)
		}
		next := &localAddrs{addrs: make(map[netip.Addr]bool, len(addrs)), read: time.Now()}
		for _, a := range addrs {
			next.addrs[a.Unmap().WithZone("")] = true
		}
		s.local.Store(next)
		la = next
	}
	return la.addrs[addr]
}

// Zone returns the zone the server answers from, nil before the first Update.
func (s *Server) Zone() *Zone { return s.zone.Load() }

// Start listens on cfg.Listen over UDP and TCP (the same port) and serves in the background
// until Shutdown. While the address is in use it retries for Config.BindRetry.
func (s *Server) Start() error {
	s.mu.Lock()
	if s.state != stateNew {
		s.mu.Unlock()
		return errors.New("dns server: already started (a server starts once)")
	}
	s.state = stateStarting
	s.mu.Unlock()
	// Not under mu: a Shutdown meanwhile cancels s.ctx, which ends the retries.
	pc, ln, err := s.listen()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.state != stateStarting {
		pc.Close()
		ln.Close()
		err = errors.New("dns server: shut down while starting")
	}
	if err != nil {
		if s.state == stateStarting {
			s.state = stateStopped
		}
		return err
	}
	s.addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	udp := &mdns.Server{PacketConn: pc, Handler: s, UDPSize: mdns.MaxMsgSize, ReadTimeout: 2 * time.Second}
	tcp := &mdns.Server{Listener: ln, Handler: s, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}
	s.servers = []*mdns.Server{udp, tcp}
	s.done = make(chan struct{})
	var started, finished sync.WaitGroup
	addr := s.addr.String()
	for _, srv := range s.servers {
		started.Add(1)
		finished.Add(1)
		var once sync.Once
		srv.NotifyStartedFunc = func() { once.Do(started.Done) }
		go func() {
			defer finished.Done()
			err := srv.ActivateAndServe()
			once.Do(started.Done) // it failed before it started
			if err != nil {
				s.log.Error("dns server stopped", "addr", addr, "err", err)
			}
		}()
	}
	go func() { finished.Wait(); close(s.done) }()
	started.Wait()
	s.state = stateStarted
	s.log.Info("dns server listening", "addr", s.addr.String(), "zone", Origin, "upstreams", s.ups())
	return nil
}

// Addr is the address the server listens on (UDP and TCP), valid after Start.
func (s *Server) Addr() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Shutdown stops listening, waits for the queries in flight (until ctx ends) and returns.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel()
	if s.state != stateStarted {
		s.state = stateStopped
		return nil
	}
	s.state = stateStopped
	var errs []error
	for _, srv := range s.servers {
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// Run starts the server and serves until ctx is done, then shuts it down.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Shutdown(sctx)
}

// ServeDNS implements mdns.Handler: forward names outside the zone, answer the others, then
// fit the response to the transport (truncated with TC over UDP beyond the client's size).
func (s *Server) ServeDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	if req == nil {
		return
	}
	start := time.Now()
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	var resp *mdns.Msg
	source := "zone"
	if !s.ClientAllowed(remoteAddr(w.RemoteAddr())) {
		source = "refused"
		resp = errorReply(req, mdns.RcodeRefused)
	} else if s.forwardable(req) {
		source = "upstream"
		resp = s.forward(req, tcp)
	} else {
		resp = Answer(s.zone.Load(), req)
	}
	if resp == nil {
		return
	}
	resp.RecursionAvailable = len(s.ups()) > 0
	// An upstream's OPT advertises the upstream's size; the client talks to this server.
	if opt := resp.IsEdns0(); opt != nil && opt.UDPSize() > MaxUDPResponse {
		opt.SetUDPSize(MaxUDPResponse)
	}
	if tcp {
		resp.Truncate(mdns.MaxMsgSize)
	} else {
		resp.Truncate(min(udpSize(req), MaxUDPResponse))
	}
	if err := w.WriteMsg(resp); err != nil {
		s.log.Debug("dns: write response", "remote", w.RemoteAddr().String(), "err", err)
	}
	if s.metrics != nil {
		s.metrics.observe(source, resp.Rcode, time.Since(start))
	}
}

// remoteAddr is the IP address of a DNS client (invalid when it is neither UDP nor TCP).
func remoteAddr(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr()
	case *net.TCPAddr:
		return a.AddrPort().Addr()
	}
	return netip.Addr{}
}

// forwardable reports whether req is a well-formed query for a name outside the zone that
// an upstream can answer.
func (s *Server) forwardable(req *mdns.Msg) bool {
	return len(s.ups()) > 0 && !req.Response && req.Opcode == mdns.OpcodeQuery &&
		len(req.Question) == 1 && !InZone(req.Question[0].Name)
}

// forward sends req to the upstreams in order until one answers: over UDP first, over TCP
// when the UDP answer is truncated or the client asked over TCP. SERVFAIL when none answers;
// REFUSED when MaxForwards queries are already in flight.
func (s *Server) forward(req *mdns.Msg, viaTCP bool) *mdns.Msg {
	select {
	case s.fwdSlots <- struct{}{}:
		defer func() { <-s.fwdSlots }()
	default:
		return errorReply(req, mdns.RcodeRefused)
	}
	ctx, cancel := context.WithTimeout(s.ctx, forwardBudget)
	defer cancel()
	var lastErr error
	for _, up := range s.ups() {
		resp, err := s.exchange(ctx, req, up, viaTCP)
		if err == nil {
			return resp
		}
		lastErr = err
		if s.metrics != nil {
			s.metrics.upstreamFailures.WithLabelValues(up).Inc()
		}
		if ctx.Err() != nil {
			break
		}
	}
	s.log.Debug("dns: no upstream answered", "name", req.Question[0].Name, "err", lastErr)
	return errorReply(req, mdns.RcodeServerFailure)
}

// errorReply is an empty response to req with rcode, with an OPT record when req has one.
func errorReply(req *mdns.Msg, rcode int) *mdns.Msg {
	resp := new(mdns.Msg).SetRcode(req, rcode)
	if opt := req.IsEdns0(); opt != nil {
		resp.Extra = []mdns.RR{replyOPT(opt)}
	}
	return resp
}

// exchange asks one upstream, falling back to TCP on a truncated UDP answer.
func (s *Server) exchange(ctx context.Context, req *mdns.Msg, upstream string, viaTCP bool) (*mdns.Msg, error) {
	if !viaTCP {
		resp, _, err := s.udpClient.ExchangeContext(ctx, req, upstream)
		if err != nil {
			return nil, fmt.Errorf("upstream %s udp: %w", upstream, err)
		}
		if !resp.Truncated {
			return resp, checkReply(req, resp, upstream)
		}
	}
	resp, _, err := s.tcpClient.ExchangeContext(ctx, req, upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream %s tcp: %w", upstream, err)
	}
	return resp, checkReply(req, resp, upstream)
}

// checkReply rejects an upstream answer to another question.
func checkReply(req, resp *mdns.Msg, upstream string) error {
	if len(resp.Question) == 0 && resp.Rcode != mdns.RcodeSuccess {
		return nil // FORMERR, NOTIMP, REFUSED... may echo no question
	}
	if len(resp.Question) != 1 || resp.Question[0].Qtype != req.Question[0].Qtype ||
		asciiLower(resp.Question[0].Name) != asciiLower(req.Question[0].Name) {
		return fmt.Errorf("upstream %s answered another question", upstream)
	}
	return nil
}
