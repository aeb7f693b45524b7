package clusterpolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/policy"
)

// MaxFileBytes bounds one policy file: a policyDir holds a team's policies, not a data set.
const MaxFileBytes = 1 << 20

// DefaultDebounce is how long a DirSource waits for a burst of file events (an editor's write,
// rename and chmod; a ConfigMap's symlink swap) to end before it reads the directory again.
const DefaultDebounce = 200 * time.Millisecond

// dirRetry is how often a DirSource looks again for a directory that is missing or unwatchable.
const dirRetry = 2 * time.Second

// policyFile reports whether name is a policy file: *.yaml, *.yml or *.json, not hidden (a
// ConfigMap mount's ..data and an editor's .swp are not policies).
func policyFile(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// ReadDir reads every policy file of dir, in name order, as Items: each YAML (or JSON) document
// of a file is one policy, decoded strictly (policy.DecodeYAML); a file that does not decode is
// one Item with its error, naming the file. A missing dir is an error.
func ReadDir(dir string) ([]Item, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("policyDir: %w", err)
	}
	var items []Item
	for _, e := range entries {
		if !policyFile(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		// Stat follows symlinks (a ConfigMap's files are links into ..data).
		fi, err := os.Stat(path)
		if err != nil || fi.IsDir() {
			continue
		}
		if fi.Size() > MaxFileBytes {
			items = append(items, Item{Source: path, Err: fmt.Errorf("the file is %d bytes, at most %d", fi.Size(), MaxFileBytes)})
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			items = append(items, Item{Source: path, Err: err})
			continue
		}
		items = append(items, DecodeFile(path, data)...)
	}
	return items, nil
}

// DecodeFile decodes the policies of one file (policy.DecodeYAML: YAML, or JSON, several
// documents allowed) as Items; when it fails, one Item carries the error.
func DecodeFile(path string, data []byte) []Item {
	ps, err := policy.DecodeYAML(data)
	if err != nil {
		return []Item{{Source: path, Err: err}}
	}
	if len(ps) == 0 {
		return []Item{{Source: path, Err: errors.New("no policy in the file")}}
	}
	items := make([]Item, 0, len(ps))
	for _, p := range ps {
		items = append(items, Item{Source: path, Policy: p})
	}
	return items
}

// DirSource watches a policyDir (fsnotify) and hands out its Set whenever it changes.
type DirSource struct {
	Dir      string
	Cluster  string
	Log      *slog.Logger
	Debounce time.Duration // default DefaultDebounce
}

// Run reads the directory, hands out its Set, and again after every burst of changes. A missing
// directory is a Problem, and looked for again every couple of seconds; Run returns only when
// ctx ends.
func (d *DirSource) Run(ctx context.Context, onChange func(Set)) error {
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	debounce := d.Debounce
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	var last *Set
	emit := func() {
		set := d.read()
		if last != nil && last.Equal(set) {
			return
		}
		last = &set
		onChange(set)
	}
	for ctx.Err() == nil {
		w, err := fsnotify.NewWatcher()
		if err == nil {
			err = w.Add(d.Dir)
			if err != nil {
				w.Close()
			}
		}
		emit()
		if err != nil {
			log.Debug("policyDir not watched; looking again", "policyDir", d.Dir, "err", err)
			if !retry.Sleep(ctx, dirRetry) {
				return nil
			}
			continue
		}
		d.watch(ctx, w, debounce, emit, log)
		w.Close()
	}
	return nil
}

// watch emits after each burst of events until ctx ends or the directory goes away.
func (d *DirSource) watch(ctx context.Context, w *fsnotify.Watcher, debounce time.Duration, emit func(), log *slog.Logger) {
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Clean(ev.Name) == filepath.Clean(d.Dir) && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				emit() // the directory is gone: its policies are withdrawn, and Run looks for it again
				return
			}
			timer = time.After(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflow loses events: read everything again.
			log.Warn("policyDir watch error; reading the directory again", "policyDir", d.Dir, "err", err)
			timer = time.After(debounce)
		case <-timer:
			timer = nil
			emit()
			if _, err := os.Stat(d.Dir); err != nil {
				return
			}
		}
	}
}

func (d *DirSource) read() Set {
	items, err := ReadDir(d.Dir)
	if err != nil {
		return Set{Problems: []Problem{{Source: d.Dir, Message: oneLine(err.Error())}}}
	}
	return Build(d.Cluster, items)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Names lists the synced names of a set, for logs.
func (s Set) Names() []string {
	out := make([]string, 0, len(s.Policies))
	for _, p := range s.Policies {
		out = append(out, p.Metadata.Name)
	}
	return slices.Clip(out)
}
