package reload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Package reload applies the agent's config file changes without a restart (Kubernetes updates
// a mounted ConfigMap or Secret in place and the gateway acts on it).
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

// PollInterval is how often the file's hash is compared even without an event.
const PollInterval = 10 * time.Second

// Reload timing.
const (
	// reloadDebounce is the quiet time after the last event in the watched directories before
	// the file is read.
	reloadDebounce = 200 * time.Millisecond
)

// Reloader is the config in force and the outcome of the last read of the file. mu guards the
// fields below it and is never held while applying; applyMu serialises applying configs (the
// watcher's, a test's, and the Node's address changes, which rebuild drivers too) and is taken
// before mu.
type Reloader struct {
	path string         // the config file; "" for none (no reload)
	cfg  *config.Config // the config the agent started with
	opts Options
	log  *slog.Logger

	applyMu  sync.Mutex
	mu       sync.Mutex
	cur      *config.Config // the config in force (the start-up one until a reload applies another)
	revision int
	hash     string // of the file in force
	loadedAt time.Time
	seen     string // hash of the last content read, applied or refused: not read twice
	refused  []statusapi.ConfigRefusal
	refHash  string
}

// Live is the live part of the config in force: the file the agent started with, or the last
// one a reload applied. What a reload refuses to change is the start-up config's Static part.
func (r *Reloader) Live() config.Live {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return r.cfg.Live()
	}
	return r.cur.Live()
}

// Options shape a Reloader.
type Options struct {
	Log *slog.Logger
	// LogLevelFlag is a level given on the command line: it wins over the file's logLevel.
	LogLevelFlag string
	// Apply applies what changed (plan) in next, the live part of the new config: each
	// component takes its live settings. client is the broker connection (nil before there is
	// one).
	Apply func(ctx context.Context, client apiv1.AgentClient, next config.Live, plan config.ReloadPlan)
	// ImportsChanged is called once a new imports.selector is in force.
	ImportsChanged func()
}

// New returns the reloader of the config file path, which cfg was loaded from ("" for none).
func New(path string, cfg *config.Config, opts Options) *Reloader {
	r := &Reloader{path: path, cfg: cfg, opts: opts, log: opts.Log}
	r.init()
	return r
}

// Lock serialises a change that rebuilds what a reload rebuilds (the Node's address changing)
// with the reloads.
func (r *Reloader) Lock()   { r.applyMu.Lock() }
func (r *Reloader) Unlock() { r.applyMu.Unlock() }

// init records the config the agent starts with as revision 1 (hash of the file it was
// loaded from, when there is one).
func (r *Reloader) init() {
	r.cur = r.cfg
	r.revision = 1
	r.loadedAt = time.Now()
	if r.path == "" {
		return
	}
	if data, err := os.ReadFile(r.path); err == nil {
		r.hash = hashOf(data)
		r.seen = r.hash
	}
}

// unreadable stands for the hash of a file that cannot be read.
const unreadable = "unreadable"

func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Status is the status's config block; nil when the agent watches no file.
func (r *Reloader) Status() *statusapi.ConfigStatus {
	if r.path == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return &statusapi.ConfigStatus{
		Path:        r.path,
		Revision:    r.revision,
		Hash:        r.hash,
		LoadedAt:    r.loadedAt.UTC(),
		Refused:     slices.Clone(r.refused),
		RefusedHash: r.refHash,
	}
}

// Problems are the status problems of a refused config.
func (r *Reloader) Problems() []statusapi.Problem {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []statusapi.Problem
	for _, ref := range r.refused {
		out = append(out, statusapi.Problem{Message: "agent config " + r.path + " not applied: " + ref.Message})
	}
	return out
}

// watchedDirs are the directories whose events make the agent re-read its config: the config
// file's and the join token file's (a mounted Secret is swapped the same way). The token matters
// only before the first join, which is over once the loops run, so its change is only a
// re-read of the config, which is harmless.
func (r *Reloader) watchedDirs() []string {
	dirs := []string{filepath.Dir(r.path)}
	if f := r.cfg.JoinTokenFile; f != "" && !slices.Contains(dirs, filepath.Dir(f)) {
		dirs = append(dirs, filepath.Dir(f))
	}
	return dirs
}

// Run watches the config file until ctx ends and applies its changes.
func (r *Reloader) Run(ctx context.Context, client apiv1.AgentClient) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Warn("config file not watched for changes; polling it", "config", r.path, "every", PollInterval, "err", err)
	} else {
		defer w.Close()
		for _, d := range r.watchedDirs() {
			if err := w.Add(d); err != nil {
				r.log.Warn("directory not watched for changes; polling the config", "dir", d, "every", PollInterval, "err", err)
			}
		}
		events, errs = w.Events, w.Errors
	}
	poll := time.NewTicker(PollInterval)
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
			if r.relevantEvent(ev.Name) && !pending {
				pending = true
				debounce.Reset(reloadDebounce)
			}
		case err := <-errs:
			r.log.Warn("config watch error; the poll still checks the file", "err", err)
		case <-debounce.C:
			pending = false
			r.Reload(ctx, client)
		case <-poll.C:
			r.Reload(ctx, client)
		}
	}
}

// relevantEvent reports whether an event on name may have changed the config file: the file
// itself (written, or renamed over), Kubernetes' `..data` symlink and timestamped `..` dirs of a
// mounted ConfigMap or Secret, or the join token file.
func (r *Reloader) relevantEvent(name string) bool {
	base := filepath.Base(name)
	return base == filepath.Base(r.path) || strings.HasPrefix(base, "..") ||
		(r.cfg.JoinTokenFile != "" && base == filepath.Base(r.cfg.JoinTokenFile))
}

// Reload reads the config file and, when its content changed, applies it or refuses it.
// client re-registers the endpoint when a driver's port changed (nil: not registered now; the
// heartbeat loop's next registration carries it).
func (r *Reloader) Reload(ctx context.Context, client apiv1.AgentClient) {
	if r.path == "" {
		return
	}
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	data, err := os.ReadFile(r.path)
	if err != nil {
		// A rename over the file never leaves it missing; a deleted file is not a config, and the
		// running one stays. Said once, not at every poll.
		r.mu.Lock()
		said := r.seen == unreadable
		r.mu.Unlock()
		if !said {
			r.refuse("", unreadable, fmt.Sprintf("cannot read the file: %v; the running config is kept", err))
		}
		return
	}
	hash := hashOf(data)
	r.mu.Lock()
	seen, cur := r.seen, r.cur
	r.mu.Unlock()
	if hash == seen {
		return
	}
	start := time.Now()
	next, err := config.ParseFile(r.path, data)
	if err != nil {
		r.refuse(errorField(err), hash, err.Error()+"; the running config is kept")
		return
	}
	if r.opts.LogLevelFlag != "" {
		// --log-level wins over the file, as it did at start.
		next.LogLevel = r.opts.LogLevelFlag
	}
	plan := config.Diff(cur, next)
	if len(plan.Refused) > 0 {
		var rs []statusapi.ConfigRefusal
		for _, c := range plan.Refused {
			rs = append(rs, statusapi.ConfigRefusal{Field: c.Field, Message: config.RefusedMessage(c)})
			r.log.Error("CONFIG CHANGE REFUSED: "+config.RefusedMessage(c), "config", r.path, "field", c.Field, "running", c.Old, "file", c.New)
		}
		r.setRefused(hash, rs)
		return
	}
	r.opts.Apply(ctx, client, next.Live(), plan)
	r.mu.Lock()
	r.cur, r.hash, r.seen = next, hash, hash
	r.revision++
	r.loadedAt = time.Now()
	r.refused, r.refHash = nil, ""
	rev := r.revision
	r.mu.Unlock()
	if plan.Imports && r.opts.ImportsChanged != nil {
		// Only now: the new stream must be opened with the selector of the config in force.
		r.opts.ImportsChanged()
	}
	var changes []string
	for _, c := range plan.Live {
		changes = append(changes, c.String())
	}
	r.log.Info("config reloaded", "config", r.path, "revision", rev, "hash", hash, "changes", strings.Join(changes, "; "),
		"duration", time.Since(start).Round(time.Millisecond).String())
}

// refuse records a config that is not in force because of one problem.
func (r *Reloader) refuse(field, hash, msg string) {
	r.log.Error("CONFIG CHANGE REFUSED: "+msg, "config", r.path, "field", field)
	r.setRefused(hash, []statusapi.ConfigRefusal{{Field: field, Message: msg}})
}

func (r *Reloader) setRefused(hash string, rs []statusapi.ConfigRefusal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen, r.refused, r.refHash = hash, rs, hash
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
