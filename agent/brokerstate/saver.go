package brokerstate

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// DefaultSaveInterval is how often, at most, a Saver writes the cache file. The cache only has
// to be recent enough to start from without the broker (a restart resumes the watch from the
// cached revision and the broker sends what is newer), so a second behind is plenty.
const DefaultSaveInterval = time.Second

// Saver coalesces the cache file's writes. Each watch message gives a new state; writing the whole
// file (temp file, fsync, rename) for each is a megabyte and an fsync per delta on a large mesh.
// A Saver keeps the latest state and writes it at most once per interval: the first state after
// a quiet interval at once, later ones when the interval since the last write has passed. Close
// writes what is still pending, so a clean stop never loses the last state; a crash loses at most
// one interval, and the file is always one whole state (the write is atomic).
//
// A failed write is logged and counted, and the state is kept to be written again after an
// interval unless a newer one replaced it.
type Saver struct {
	path     string
	interval time.Duration
	log      *slog.Logger
	// write writes the file; statefile.WriteAtomic through WriteFileAtomic unless a test or a
	// bench counts the writes.
	write func(path string, data []byte, perm os.FileMode) error

	// writeMu is held over a whole write (taking the pending state and writing it), so writes
	// happen one at a time and in the order of their states.
	writeMu sync.Mutex

	mu        sync.Mutex // guards the fields below; never held during a write
	pending   *State     // the latest state not yet written; nil when the file is up to date
	timer     *time.Timer
	lastWrite time.Time // when the last write started
	closed    bool
	failing   bool // the last write failed (its error logged); the next success says so
	stats     SaverStats
}

// SaverStats counts a Saver's work.
type SaverStats struct {
	Updates uint64 // states handed to Update
	Writes  uint64 // files written (each one fsync)
	Bytes   uint64 // bytes written
	Errors  uint64 // writes that failed
}

// NewSaver returns a Saver of dir/broker-state.json that writes at most once per interval
// (DefaultSaveInterval if interval is not positive). It starts nothing until the first Update.
func NewSaver(dir string, interval time.Duration, log *slog.Logger) *Saver {
	if interval <= 0 {
		interval = DefaultSaveInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &Saver{path: filepath.Join(dir, FileName), interval: interval, log: log, write: WriteFileAtomic}
}

// SetWriteFunc replaces how the Saver writes the file (a test's or a bench's counting writer);
// call it before the first Update.
func (s *Saver) SetWriteFunc(write func(path string, data []byte, perm os.FileMode) error) {
	s.mu.Lock()
	s.write = write
	s.mu.Unlock()
}

// Update hands the Saver the latest state; it returns at once and the write follows within the
// interval. The Saver keeps a shallow copy of st: its maps and records must not be changed
// afterwards (the agent replaces its state on every message, it never edits one in place).
// After Close, Update writes at once.
func (s *Saver) Update(st *State) {
	cp := *st
	s.mu.Lock()
	s.stats.Updates++
	s.pending = &cp
	if s.closed {
		s.mu.Unlock()
		_ = s.Flush()
		return
	}
	s.scheduleLocked()
	s.mu.Unlock()
}

// scheduleLocked arms the timer for the next write, unless one is armed already: at once when
// the last write is an interval old, else when it will be.
func (s *Saver) scheduleLocked() {
	if s.timer != nil {
		return
	}
	delay := max(time.Until(s.lastWrite.Add(s.interval)), 0)
	s.timer = time.AfterFunc(delay, s.onTimer)
}

func (s *Saver) onTimer() {
	s.mu.Lock()
	s.timer = nil
	s.mu.Unlock()
	_ = s.Flush()
}

// Flush writes the pending state now, if there is one, and returns the write's error.
func (s *Saver) Flush() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	st := s.pending
	s.pending = nil
	write := s.write
	if st != nil {
		s.lastWrite = time.Now()
	}
	s.mu.Unlock()
	if st == nil {
		return nil
	}
	data, err := st.Marshal(time.Now())
	if err == nil {
		err = write(s.path, data, 0o600)
	}
	s.afterWrite(st, len(data), err)
	return err
}

// afterWrite counts a write and logs a change between failing and working; a failed state is
// kept to be written again unless a newer one came meanwhile.
func (s *Saver) afterWrite(st *State, n int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.stats.Writes++
		s.stats.Bytes += uint64(n)
		if s.failing {
			s.failing = false
			s.log.Info("broker state persisted again", "path", s.path, "revision", st.Revision)
		}
		return
	}
	s.stats.Errors++
	if !s.failing {
		s.failing = true
		s.log.Error("cannot persist broker state; running on memory, will retry", "path", s.path, "revision", st.Revision, "err", err)
	} else {
		s.log.Debug("broker state still cannot be persisted", "path", s.path, "revision", st.Revision, "err", err)
	}
	if s.pending == nil {
		s.pending = st
	}
	if !s.closed {
		s.scheduleLocked()
	}
}

// Close stops the timer and writes the pending state, if any, returning that write's error.
// Later Updates write at once.
func (s *Saver) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.mu.Unlock()
	if err := s.Flush(); err != nil {
		return fmt.Errorf("flush broker state on close: %w", err)
	}
	return nil
}

// Stats returns the Saver's counters.
func (s *Saver) Stats() SaverStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}
