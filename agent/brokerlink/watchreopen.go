package brokerlink

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

// watchReopen is a channel closed when the current watch stream must be replaced.
func (l *Link) watchReopen() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watch.reopen == nil {
		l.watch.reopen = make(chan struct{})
	}
	return l.watch.reopen
}

// ReopenWatch ends the current watch stream; the next one asks for a full snapshot with the
// selector in force. Call it once the new config is in force (liveConfig).
func (l *Link) ReopenWatch() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watch.reopen != nil {
		close(l.watch.reopen)
	}
	l.watch.reopen = make(chan struct{})
	l.watch.snapshot = true
}

// watchSince is the revision the next watch stream resumes from: 0 (a full snapshot) once after
// reopenWatch, else the last revision applied.
func (l *Link) watchSince() uint64 {
	l.mu.Lock()
	snap := l.watch.snapshot
	l.watch.snapshot = false
	l.mu.Unlock()
	if snap {
		return 0
	}
	return l.revision()
}
