// Package health probes remote gateways through their tunnels and keeps RTT statistics, in the
// manner of Linkerd multicluster's gateway probes: one prober per remote connection
// sends an ICMP echo every period from this node's health-check address (its address inside its
// own pod CIDRs, the one the cable's routes use as source) to the remote endpoint's
// health_check_ip, so the probe takes the same path as pod traffic. A connection whose probes
// fail failureThreshold times in a row is in error, whatever its device says; one success
// recovers it.
//
// The decisions (Window statistics, Merge of device and probe state) are pure and table-tested;
// Manager and ICMP are the thin shell that owns goroutines and sockets.
package health

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Defaults: a probe every 300ms, a gateway declared down after 3 consecutive failures, so a dead
// gateway is detected 0.9-1.2s after it died (the third failed probe's timeout), which lets the
// services datapath fail over in well under 2s. Each probe is one ICMP echo and its reply (36
// bytes each at the IP layer): 3.3 probes/s per direction and pair. The timeout equals the period
// so one slow answer never delays the next probe. Linkerd's gateway probes (3s x 3, timeout 2s:
// down within 6-9s) are reachable by config.
const (
	DefaultPeriod           = 300 * time.Millisecond
	DefaultTimeout          = 300 * time.Millisecond
	DefaultFailureThreshold = 3
)

// DefaultRecoveryHold is how long a gateway that went down must answer its probes without a
// failure before traffic moves back to it, on both ends of a pair: a gateway's probes of a remote
// gateway it failed over from, and a worker's probes of its own cluster's gateways. It is long
// against a probe period (a flapping link does not pull traffic back and forth at every answer)
// and short against a lease (the preferred gateway is used again long before the broker would
// have noticed anything). Both ends hold for the same time from the same event (the gateway
// answering again), so they move back within about one probe period of each other.
const DefaultRecoveryHold = 5 * time.Second

// Settings are the probe timing; zero fields take the defaults (see WithDefaults).
type Settings struct {
	Period           time.Duration
	Timeout          time.Duration
	FailureThreshold int
	// Window is how many of the latest samples the RTT statistics cover.
	Window int
	// RecoveryHold is how long a target that went down must answer without a single failure
	// before it is usable again (Result.Usable): the hysteresis that keeps a gateway coming back
	// from pulling traffic to itself, and away again, on every answered probe. Zero: one answer
	// recovers it (the prober's OnChange then fires on the threshold crossing alone).
	RecoveryHold time.Duration
}

// WithDefaults fills zero fields with the defaults.
func (s Settings) WithDefaults() Settings {
	if s.Period <= 0 {
		s.Period = DefaultPeriod
	}
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	if s.FailureThreshold <= 0 {
		s.FailureThreshold = DefaultFailureThreshold
	}
	if s.Window <= 0 {
		s.Window = DefaultWindow
	}
	return s
}

// Target is what one prober probes.
type Target struct {
	Cluster string // the remote cluster: the key of the connection
	Node    string // the remote gateway node
	// Source is this node's health-check address, Destination the remote endpoint's.
	Source, Destination netip.Addr
	// StartDown marks a target known to be down when its prober starts: it is usable
	// (Result.Usable) only once it has answered for the recovery hold, and OnChange fires then.
	StartDown bool
}

func (t Target) String() string {
	return fmt.Sprintf("%s/%s %s->%s", t.Cluster, t.Node, t.Source, t.Destination)
}

// Pinger sends one probe and waits for its answer.
type Pinger interface {
	Ping(ctx context.Context, timeout time.Duration) (time.Duration, error)
	Close() error
}

// NewPinger opens a Pinger for a target (e.g. an ICMP raw socket).
type NewPinger func(Target) (Pinger, error)

// ICMPPinger is the NewPinger of the agent: ICMP echo over a raw socket.
func ICMPPinger(t Target) (Pinger, error) {
	p, err := NewICMP(t.Source, t.Destination)
	if err != nil {
		return nil, err // not a nil *ICMP inside a non-nil Pinger
	}
	return p, nil
}

// Result is what a prober knows about its target.
type Result struct {
	Target Target
	// Sent counts probes attempted, Failed those that got no answer or could not be sent.
	Sent, Failed uint64
	// ConsecutiveFailures counts failures since the last success.
	ConsecutiveFailures int
	// LastError is the error of the last failed probe (kept after a recovery, for diagnosis).
	LastError   string
	LastProbe   time.Time
	LastSuccess time.Time
	// LastDown is when the target last crossed the failure threshold (zero: never since the
	// prober started); UpSince is the first success of the current run of successes (zero after
	// a failure). Together they say whether a recovered target has answered for its hold.
	LastDown, UpSince time.Time
	// RTT holds the statistics of the window; HasRTT is false before the first success.
	RTT    Summary
	HasRTT bool
}

// Healthy says whether the target answers: fewer than threshold consecutive failures.
func (r Result) Healthy(threshold int) bool { return r.ConsecutiveFailures < threshold }

// Usable says whether the target may carry traffic at now: healthy, and, when it went down
// since its prober started, answering without a failure for at least hold since. A target that
// never went down is usable while healthy, so a prober that starts does not hold traffic back.
func (r Result) Usable(threshold int, hold time.Duration, now time.Time) bool {
	if !r.Healthy(threshold) {
		return false
	}
	if r.LastDown.IsZero() || hold <= 0 {
		return true
	}
	return !r.UpSince.IsZero() && now.Sub(r.UpSince) >= hold
}

// Holding says whether the target answers again after going down but has not answered for its
// hold yet (Usable is false only because of the hold).
func (r Result) Holding(threshold int, hold time.Duration, now time.Time) bool {
	return r.Healthy(threshold) && !r.Usable(threshold, hold, now)
}

// Merge decides a connection's final state from what its device says and what its probes say.
// It is pure. probe is nil when the connection is not probed (no health-check address on either
// end, or probing disabled): the device alone decides.
//
//   - A device in error stays in error with its own message: it knows the cause better.
//   - failureThreshold or more consecutive probe failures put the connection in error, however
//     fine the device looks, with the probes' message.
//   - Otherwise the device's state and message stand; a probe that has not answered yet (fewer
//     failures than the threshold) does not downgrade a connected device.
func Merge(device cable.State, deviceMsg string, probe *Result, threshold int) (cable.State, string) {
	if probe == nil || device == cable.StateError {
		return device, deviceMsg
	}
	if probe.ConsecutiveFailures >= threshold {
		return cable.StateError, FailureMessage(probe.ConsecutiveFailures, probe.LastError)
	}
	return device, deviceMsg
}

// FailureMessage is the status message of a connection whose probes keep failing.
func FailureMessage(consecutive int, lastErr string) string {
	s := "s"
	if consecutive == 1 {
		s = ""
	}
	return fmt.Sprintf("health probe: %d consecutive failure%s (last: %s)", consecutive, s, lastErr)
}

// Observer is told of every probe result as it happens (Prometheus metrics), and when a
// cluster's prober goes away.
type Observer interface {
	Observe(cluster string, rtt time.Duration, err error)
	Forget(cluster string)
}

// Manager runs one prober per target, keyed by cluster. It owns the probers' goroutines: Sync
// starts and stops them, Close stops them all and waits.
type Manager struct {
	settings  Settings
	newPinger NewPinger
	obs       Observer
	log       *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	probers  map[string]*prober
	closed   bool
	onChange func(cluster string, healthy bool)
	subject  string // what the targets are, in log messages (SetSubject)
}

// SetSubject names what the targets are in the probers' log messages ("local gateway" for a
// non-gateway node's probes of its own cluster's gateways); default "remote gateway". Set it
// before the first Sync.
func (m *Manager) SetSubject(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.subject = s
}

// OnChange sets f to be called, from the prober's goroutine, whenever a cluster's probes cross
// the failure threshold (healthy false) or answer again (healthy true): the agent takes a failing
// pair's backends out of its service maps at once, not at its next resync. f must not block.
// Set it before the first Sync.
func (m *Manager) OnChange(f func(cluster string, healthy bool)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onChange = f
}

// NewManager returns a Manager that probes with settings (zero fields defaulted). newPinger nil
// means ICMPPinger; obs may be nil.
func NewManager(settings Settings, newPinger NewPinger, obs Observer, log *slog.Logger) *Manager {
	if newPinger == nil {
		newPinger = ICMPPinger
	}
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{
		settings: settings.WithDefaults(), newPinger: newPinger, obs: obs, log: log,
		ctx: ctx, cancel: cancel, probers: map[string]*prober{}, subject: "remote gateway",
	}
}

// Settings returns the effective settings.
func (m *Manager) Settings() Settings {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settings
}

// SetSettings changes the settings (zero fields defaulted) of a running manager, from a config
// reload: every prober restarts on its target with the new period, timeout, threshold and window
// (their statistics start over, as the old ones were measured under other settings).
func (m *Manager) SetSettings(settings Settings) {
	m.mu.Lock()
	defer m.mu.Unlock()
	settings = settings.WithDefaults()
	if m.closed || settings == m.settings {
		m.settings = settings
		return
	}
	m.settings = settings
	for cluster, p := range m.probers {
		p.stop()
		if m.obs != nil {
			m.obs.Forget(cluster)
		}
		m.probers[cluster] = m.start(p.target)
	}
	m.log.Info("health probe settings changed", "period", settings.Period, "timeout", settings.Timeout,
		"failureThreshold", settings.FailureThreshold, "window", settings.Window, "probers", len(m.probers))
}

// Sync makes the probers match targets (one per cluster; a later duplicate is ignored): new
// targets start probing at once, removed ones stop, and a target whose node or addresses
// changed starts over with fresh statistics. Unchanged targets keep running undisturbed.
func (m *Manager) Sync(targets []Target) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	want := map[string]Target{}
	for _, t := range targets {
		if _, dup := want[t.Cluster]; !dup {
			want[t.Cluster] = t
		}
	}
	for cluster, p := range m.probers {
		if t, ok := want[cluster]; ok && t == p.target {
			continue
		}
		p.stop()
		delete(m.probers, cluster)
		if m.obs != nil {
			m.obs.Forget(cluster)
		}
		m.log.Info("health probe stopped", "cluster", cluster, "node", p.target.Node, "target", p.target.Destination)
	}
	for cluster, t := range want {
		if _, ok := m.probers[cluster]; ok {
			continue
		}
		p := m.start(t)
		m.probers[cluster] = p
		m.log.Info("health probe started", "cluster", cluster, "node", t.Node, "source", t.Source, "target", t.Destination,
			"period", m.settings.Period, "timeout", m.settings.Timeout, "failureThreshold", m.settings.FailureThreshold)
	}
}

// Result returns the probe result of cluster's connection; ok is false when it is not probed.
func (m *Manager) Result(cluster string) (Result, bool) {
	m.mu.Lock()
	p, ok := m.probers[cluster]
	m.mu.Unlock()
	if !ok {
		return Result{}, false
	}
	return p.result(), true
}

// Close stops every prober and waits for them.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.probers = map[string]*prober{}
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
}

type prober struct {
	target   Target
	settings Settings
	cancel   context.CancelFunc

	mu     sync.Mutex
	res    Result
	window *Window
}

func (m *Manager) start(t Target) *prober {
	ctx, cancel := context.WithCancel(m.ctx)
	p := &prober{target: t, settings: m.settings, cancel: cancel, window: NewWindow(m.settings.Window)}
	p.res.Target = t
	if t.StartDown {
		p.res.LastDown = time.Now()
	}
	log := m.log.With("cluster", t.Cluster, "node", t.Node)
	onChange, subject := m.onChange, m.subject
	m.wg.Go(func() { p.run(ctx, m.newPinger, m.obs, onChange, subject, log) })
	return p
}

func (p *prober) stop() { p.cancel() }

// run probes until ctx ends: at once, then every period. The socket is opened lazily and
// reopened after a send error (the source address may have come and gone).
func (p *prober) run(ctx context.Context, newPinger NewPinger, obs Observer, onChange func(string, bool), subject string, log *slog.Logger) {
	var pinger Pinger
	defer func() {
		if pinger != nil {
			_ = pinger.Close()
		}
	}()
	t := time.NewTicker(p.settings.Period)
	defer t.Stop()
	wasHealthy, wasUsable := true, !p.target.StartDown
	for {
		var rtt time.Duration
		var err error
		if pinger == nil {
			if pinger, err = newPinger(p.target); err != nil {
				// Whatever came with the error (a typed nil, say) is not a usable pinger.
				pinger = nil
			}
		}
		if err == nil {
			rtt, err = pinger.Ping(ctx, p.settings.Timeout)
			if err != nil && !IsTimeout(err) && pinger != nil {
				_ = pinger.Close()
				pinger = nil
			}
		}
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		healthy, usable := p.record(now, rtt, err)
		if obs != nil {
			obs.Observe(p.target.Cluster, rtt, err)
		}
		switch {
		case wasHealthy && !healthy:
			log.Warn(subject+" fails its health probes", "target", p.target.Destination, "failures", p.settings.FailureThreshold, "err", err)
		case !wasHealthy && healthy:
			log.Info(subject+" answers its health probes again", "target", p.target.Destination, "rtt", rtt, "recoveryHold", p.settings.RecoveryHold)
		case !wasUsable && usable && p.settings.RecoveryHold > 0:
			log.Info(subject+" has answered for its recovery hold; usable again", "target", p.target.Destination, "hold", p.settings.RecoveryHold)
		}
		// Without a hold, usable is healthy: OnChange fires on the threshold crossings. With one,
		// it fires when the target goes down and when it has answered for the hold.
		if wasUsable != usable && onChange != nil {
			onChange(p.target.Cluster, usable)
		}
		wasHealthy, wasUsable = healthy, usable
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// record updates the result with one probe outcome and reports whether the target is healthy
// and whether it is usable (Result.Usable).
func (p *prober) record(now time.Time, rtt time.Duration, err error) (healthy, usable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.res.record(now, rtt, err, p.settings.FailureThreshold, p.window)
	return p.res.Healthy(p.settings.FailureThreshold), p.res.Usable(p.settings.FailureThreshold, p.settings.RecoveryHold, now)
}

// record adds one probe outcome at now to r; window takes the RTT of a success.
func (r *Result) record(now time.Time, rtt time.Duration, err error, threshold int, window *Window) {
	r.Sent++
	r.LastProbe = now
	if err != nil {
		r.Failed++
		r.ConsecutiveFailures++
		r.LastError = err.Error()
		r.UpSince = time.Time{}
		if r.ConsecutiveFailures == threshold {
			r.LastDown = now
		}
		return
	}
	r.ConsecutiveFailures = 0
	r.LastSuccess = now
	if r.UpSince.IsZero() {
		r.UpSince = now
	}
	window.Add(rtt)
	r.RTT, r.HasRTT = window.Summary()
}

func (p *prober) result() Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}
