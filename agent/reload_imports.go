package agent

import "errors"

// imports.selector changes live: the broker filters the imports by the selector a watch stream
// was opened with, so the agent opens a new stream with the new one. It asks for a full
// snapshot rather than resuming: the broker sends the imports whole with a stream's first
// message, but a resumed stream with nothing new to say may send no first message for a long
// time, and the node would keep serving the old selector's imports meanwhile.

// errWatchReopen ends a watch stream that a reload replaced (a new imports.selector).
var errWatchReopen = errors.New("the watch is reopened with the new imports.selector")

// watchState asks the watch loop for a new stream.
type watchState struct {
	reopen   chan struct{} // closed, and replaced, by reopenWatch
	snapshot bool          // the next stream asks for a full snapshot
}

// importSelector is the imports.selector in force (reload.go swaps the config).
func (a *Agent) importSelector() string { return a.liveConfig().Imports.EffectiveSelector() }

// watchReopen is a channel closed when the current watch stream must be replaced.
func (a *Agent) watchReopen() <-chan struct{} {
	a.reload.mu.Lock()
	defer a.reload.mu.Unlock()
	if a.reload.watch.reopen == nil {
		a.reload.watch.reopen = make(chan struct{})
	}
	return a.reload.watch.reopen
}

// reopenWatch ends the current watch stream; the next one asks for a full snapshot with the
// selector in force. Call it once the new config is in force (liveConfig).
func (a *Agent) reopenWatch() {
	a.reload.mu.Lock()
	defer a.reload.mu.Unlock()
	if a.reload.watch.reopen != nil {
		close(a.reload.watch.reopen)
	}
	a.reload.watch.reopen = make(chan struct{})
	a.reload.watch.snapshot = true
}

// watchSince is the revision the next watch stream resumes from: 0 (a full snapshot) once after
// reopenWatch, else the last revision applied.
func (a *Agent) watchSince() uint64 {
	a.reload.mu.Lock()
	snap := a.reload.watch.snapshot
	a.reload.watch.snapshot = false
	a.reload.mu.Unlock()
	if snap {
		return 0
	}
	return a.revision()
}
