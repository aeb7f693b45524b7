package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// Configuration changes without a restart (issue 12, item 6; seed 004: Kubernetes updates a
// mounted ConfigMap or Secret in place and the gateway acts on it).
//
// The agent watches the directory of its config file, not the file: Kubernetes updates a
// mounted ConfigMap by writing a new timestamped directory and swapping the `..data` symlink, so
// the file's own inode never changes and a watch on it would see nothing (or lose the watch when
// an editor renames over it). Any event in the directory re-reads the file after a short quiet
// time (the swap is several events); a slow poll of the file's hash catches what events miss
// (an overlay or network filesystem without inotify).
//
// A new file is parsed and validated with the code the agent started with (config.ParseFile),
// compared with the config in force (config.Diff), and then either applied, only what changed,
// or refused whole: one field that cannot change while the agent runs (cluster, node, stateDir,
// ...) refuses the file, and the running state stays exactly as it was.

// Reload timing.
const (
	// reloadDebounce is the quiet time after the last event in the watched directories before
	// the file is read.
	reloadDebounce = 200 * time.Millisecond
	// reloadPoll is how often the file's hash is compared even without an event.
	reloadPoll = 10 * time.Second
	// reregisterAttempts bounds the endpoint registrations a driver change makes at once; the
	// heartbeat loop re-registers later if the broker forgot the endpoint meanwhile.
	reregisterAttempts = 5
)

// reloadState is the config in force and the outcome of the last read of the file.
type reloadState struct {
	mu       sync.Mutex
	cur      *config.Config // the config in force (Options.Config until a reload applies one)
	revision int
	hash     string // of the file in force
	loadedAt time.Time
	seen     string // hash of the last content read, applied or refused: not read twice
	refused  []statusapi.ConfigRefusal
	refHash  string
	// apply serialises applying configs (the watcher's and a test's); cur is swapped only once a
	// config is applied whole.
	apply sync.Mutex
}

// liveConfig is the config in force: the file the agent started with, or the last one a reload
// applied. The fields a reload refuses to change are the same in both, so code that reads only
// those may keep reading a.cfg.
func (a *Agent) liveConfig() *config.Config {
	a.reload.mu.Lock()
	defer a.reload.mu.Unlock()
	if a.reload.cur == nil {
		return a.cfg
	}
	return a.reload.cur
}

// initReload records the config the agent starts with as revision 1 (hash of the file it was
// loaded from, when Options.ConfigPath names one).
func (a *Agent) initReload() {
	a.reload.cur = a.cfg
	a.reload.revision = 1
	a.reload.loadedAt = time.Now()
	if a.opts.ConfigPath == "" {
		return
	}
	if data, err := os.ReadFile(a.opts.ConfigPath); err == nil {
		a.reload.hash = hashOf(data)
		a.reload.seen = a.reload.hash
	}
}

// unreadable stands for the hash of a file that cannot be read.
const unreadable = "unreadable"

func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// configStatus is the status's config block; nil when the agent watches no file.
func (a *Agent) configStatus() *statusapi.ConfigStatus {
	if a.opts.ConfigPath == "" {
		return nil
	}
	a.reload.mu.Lock()
	defer a.reload.mu.Unlock()
	return &statusapi.ConfigStatus{
		Path:        a.opts.ConfigPath,
		Revision:    a.reload.revision,
		Hash:        a.reload.hash,
		LoadedAt:    a.reload.loadedAt.UTC(),
		Refused:     slices.Clone(a.reload.refused),
		RefusedHash: a.reload.refHash,
	}
}

// configProblems are the status problems of a refused config.
func (a *Agent) configProblems() []statusapi.Problem {
	a.reload.mu.Lock()
	defer a.reload.mu.Unlock()
	var out []statusapi.Problem
	for _, r := range a.reload.refused {
		out = append(out, statusapi.Problem{Message: "agent config " + a.opts.ConfigPath + " not applied: " + r.Message})
	}
	return out
}

// watchedDirs are the directories whose events make the agent re-read its config: the config
// file's and the join token file's (a mounted Secret is swapped the same way). The token matters
// only before the first join, which is over once the loops run, so its change is only a
// re-read of the config, which is harmless.
func (a *Agent) watchedDirs() []string {
	dirs := []string{filepath.Dir(a.opts.ConfigPath)}
	if f := a.cfg.JoinTokenFile; f != "" && !slices.Contains(dirs, filepath.Dir(f)) {
		dirs = append(dirs, filepath.Dir(f))
	}
	return dirs
}

// runReload watches the config file until ctx ends and applies its changes.
func (a *Agent) runReload(ctx context.Context, client apiv1.AgentClient) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	w, err := fsnotify.NewWatcher()
	if err != nil {
		a.log.Warn("config file not watched for changes; polling it", "config", a.opts.ConfigPath, "every", reloadPoll, "err", err)
	} else {
		defer w.Close()
		for _, d := range a.watchedDirs() {
			if err := w.Add(d); err != nil {
				a.log.Warn("directory not watched for changes; polling the config", "dir", d, "every", reloadPoll, "err", err)
			}
		}
		events, errs = w.Events, w.Errors
	}
	poll := time.NewTicker(reloadPoll)
	defer poll.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			// The quiet time runs from the first event, not the last: the directory may hold
			// files written all the time (logs), which must not put the reload off for ever.
			if a.relevantEvent(ev.Name) && !pending {
				pending = true
				debounce.Reset(reloadDebounce)
			}
		case err := <-errs:
			a.log.Warn("config watch error; the poll still checks the file", "err", err)
		case <-debounce.C:
			pending = false
			a.ReloadConfig(ctx, client)
		case <-poll.C:
			a.ReloadConfig(ctx, client)
		}
	}
}

// relevantEvent reports whether an event on name may have changed the config file: the file
// itself (written, or renamed over), Kubernetes' `..data` symlink and timestamped `..` dirs of a
// mounted ConfigMap or Secret, or the join token file.
func (a *Agent) relevantEvent(name string) bool {
	base := filepath.Base(name)
	return base == filepath.Base(a.opts.ConfigPath) || strings.HasPrefix(base, "..") ||
		(a.cfg.JoinTokenFile != "" && base == filepath.Base(a.cfg.JoinTokenFile))
}

// ReloadConfig reads the config file and, when its content changed, applies it or refuses it.
// client re-registers the endpoint when a driver's port changed (nil: not registered now; the
// heartbeat loop's next registration carries it).
func (a *Agent) ReloadConfig(ctx context.Context, client apiv1.AgentClient) {
	if a.opts.ConfigPath == "" {
		return
	}
	a.reload.apply.Lock()
	defer a.reload.apply.Unlock()
	data, err := os.ReadFile(a.opts.ConfigPath)
	if err != nil {
		// A rename over the file never leaves it missing; a deleted file is not a config, and the
		// running one stays. Said once, not at every poll.
		a.reload.mu.Lock()
		said := a.reload.seen == unreadable
		a.reload.mu.Unlock()
		if !said {
			a.refuse("", unreadable, fmt.Sprintf("cannot read the file: %v; the running config is kept", err))
		}
		return
	}
	hash := hashOf(data)
	a.reload.mu.Lock()
	seen, cur := a.reload.seen, a.reload.cur
	a.reload.mu.Unlock()
	if hash == seen {
		return
	}
	start := time.Now()
	next, err := config.ParseFile(a.opts.ConfigPath, data)
	if err != nil {
		a.refuse(errorField(err), hash, err.Error()+"; the running config is kept")
		return
	}
	if a.opts.LogLevelFlag != "" {
		// --log-level wins over the file, as it did at start.
		next.LogLevel = a.opts.LogLevelFlag
	}
	plan := config.Diff(cur, next)
	if len(plan.Refused) > 0 {
		var rs []statusapi.ConfigRefusal
		for _, c := range plan.Refused {
			rs = append(rs, statusapi.ConfigRefusal{Field: c.Field, Message: config.RefusedMessage(c)})
			a.log.Error("CONFIG CHANGE REFUSED: "+config.RefusedMessage(c), "config", a.opts.ConfigPath, "field", c.Field, "running", c.Old, "file", c.New)
		}
		a.setRefused(hash, rs)
		return
	}
	a.applyConfig(ctx, client, cur, next, plan)
	a.reload.mu.Lock()
	a.reload.cur, a.reload.hash, a.reload.seen = next, hash, hash
	a.reload.revision++
	a.reload.loadedAt = time.Now()
	a.reload.refused, a.reload.refHash = nil, ""
	rev := a.reload.revision
	a.reload.mu.Unlock()
	if plan.Imports {
		// Only now: the new stream must be opened with the selector of the config in force.
		a.link.ReopenWatch()
	}
	var changes []string
	for _, c := range plan.Live {
		changes = append(changes, c.String())
	}
	a.log.Info("config reloaded", "config", a.opts.ConfigPath, "revision", rev, "hash", hash, "changes", strings.Join(changes, "; "),
		"duration", time.Since(start).Round(time.Millisecond).String())
}

// refuse records a config that is not in force because of one problem.
func (a *Agent) refuse(field, hash, msg string) {
	a.log.Error("CONFIG CHANGE REFUSED: "+msg, "config", a.opts.ConfigPath, "field", field)
	a.setRefused(hash, []statusapi.ConfigRefusal{{Field: field, Message: msg}})
}

func (a *Agent) setRefused(hash string, rs []statusapi.ConfigRefusal) {
	a.reload.mu.Lock()
	defer a.reload.mu.Unlock()
	a.reload.seen, a.reload.refused, a.reload.refHash = hash, rs, hash
}

// errorFieldRE finds the field a config error names: "line 3: healthCheck.period: ..." or
// "agent config /x: cluster: ...".
var errorFieldRE = regexp.MustCompile(`(?:^|: )([a-zA-Z][a-zA-Z0-9]*(?:\[\d+\])?(?:\.[a-zA-Z][a-zA-Z0-9]*(?:\[\d+\])?)*): `)

// errorField is the config field a parse error names, "" when none.
func errorField(err error) string {
	msg := err.Error()
	for _, m := range errorFieldRE.FindAllStringSubmatch(msg, -1) {
		f := m[1]
		if f == "line" || f == "agent" || strings.HasPrefix(f, "config") || f == "decode" {
			continue
		}
		return f
	}
	return ""
}

// applyConfig applies plan, the live changes from cur to next, touching only what changed.
func (a *Agent) applyConfig(ctx context.Context, client apiv1.AgentClient, cur, next *config.Config, plan config.ReloadPlan) {
	if plan.LogLevel && a.opts.LogLevel != nil {
		a.opts.LogLevel.Set(next.SlogLevel())
	}
	if plan.Health {
		// healthCheck.enabled starts or stops the probers; the other settings go to the ones
		// that run.
		a.cables.SetHealth(next.HealthCheck.IsEnabled(), healthSettingsOf(next))
		if m := a.cables.Health(); m != nil {
			m.SetSettings(healthSettingsOf(next))
		}
		// Without probes a pair they held out of the service maps comes back.
		a.TriggerServices()
		// Wake the reconcile loop: its repair check follows the new period from its next
		// wake-up, and the pass points the probers at the pairs again.
		a.Trigger()
	}
	if plan.Exports {
		a.exports.ApplyConfig(next)
	}
	if plan.DNS {
		a.datapath().ApplyConfig(next)
	}
	if len(plan.Drivers) > 0 && a.cfg.Gateway {
		a.cables.Rebuild(ctx, next, plan.Drivers)
		a.cables.ClampMSS()
		a.reregister(ctx, client)
		a.Trigger()
	}
}

// reregister sends the endpoint again at once, so that the broker publishes the new cable ports;
// a failure is retried a few times, then left to the heartbeat loop.
func (a *Agent) reregister(ctx context.Context, client apiv1.AgentClient) {
	if client == nil {
		return
	}
	var err error
	for i := range reregisterAttempts {
		if err = a.link.Register(ctx, client); err == nil || ctx.Err() != nil {
			return
		}
		if !retry.Sleep(ctx, time.Duration(i+1)*500*time.Millisecond) {
			return
		}
	}
	a.log.Warn("endpoint not re-registered after a driver change; the broker publishes the old ports until the next registration", "err", err)
}

// healthSettingsOf are cfg's probe settings (defaults already applied by config).
func healthSettingsOf(cfg *config.Config) health.Settings {
	h := cfg.HealthCheck
	return health.Settings{Period: h.Period, Timeout: h.Timeout, FailureThreshold: h.FailureThreshold, Window: h.Window}.WithDefaults()
}
