package brokerstate

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// stateAt is a state of a few clusters and endpoints at revision rev.
func stateAt(t *testing.T, rev uint64) *State {
	t.Helper()
	s := New()
	var evs []*apiv1.Event
	for i := range 5 {
		c := fmt.Sprintf("c%d", i)
		evs = append(evs, clusterEv(c, uint32(i+1), rev), endpointEv(c, "gw", rev))
	}
	if err := s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: rev, Events: evs}); err != nil {
		t.Fatal(err)
	}
	return s
}

// countingWrite writes through WriteFileAtomic and counts the writes.
type countingWrite struct {
	n    atomic.Int64
	fail atomic.Int64 // fail this many writes first
}

func (c *countingWrite) write(path string, data []byte, perm os.FileMode) error {
	if c.fail.Load() > 0 {
		c.fail.Add(-1)
		return errors.New("disk full")
	}
	c.n.Add(1)
	return WriteFileAtomic(path, data, perm)
}

func loadRevision(t *testing.T, dir string) uint64 {
	t.Helper()
	st, err := Load(dir)
	if err != nil || st == nil {
		t.Fatalf("load: %v %v", st, err)
	}
	return st.Revision
}

func TestSaverCoalescesRapidUpdates(t *testing.T) {
	dir := t.TempDir()
	const (
		interval = 100 * time.Millisecond
		updates  = 60
		gap      = 5 * time.Millisecond
	)
	var w countingWrite
	s := NewSaver(dir, interval, slog.Default())
	s.SetWriteFunc(w.write)
	start := time.Now()
	for rev := uint64(1); rev <= updates; rev++ {
		s.Update(stateAt(t, rev))
		time.Sleep(gap)
	}
	elapsed := time.Since(start)
	// Let the last scheduled write happen on its own, without Close.
	time.Sleep(2 * interval)
	// One write at once, then at most one per interval, plus the trailing one.
	limit := int64(elapsed/interval) + 2
	if got := w.n.Load(); got > limit || got < 2 {
		t.Errorf("%d updates over %v wrote %d files, want 2..%d", updates, elapsed, got, limit)
	}
	if rev := loadRevision(t, dir); rev != updates {
		t.Errorf("file holds revision %d, want the last one %d", rev, updates)
	}
	st := s.Stats()
	if st.Updates != updates || st.Writes != uint64(w.n.Load()) || st.Errors != 0 || st.Bytes == 0 {
		t.Errorf("stats = %+v, writes counted %d", st, w.n.Load())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Writes; got != st.Writes {
		t.Errorf("Close with nothing pending wrote again: %d writes, was %d", got, st.Writes)
	}
}

func TestSaverFlushesOnClose(t *testing.T) {
	dir := t.TempDir()
	var w countingWrite
	s := NewSaver(dir, time.Hour, slog.Default())
	s.SetWriteFunc(w.write)
	s.Update(stateAt(t, 1)) // the first one is written at once
	deadline := time.Now().Add(5 * time.Second)
	for w.n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	s.Update(stateAt(t, 2))
	s.Update(stateAt(t, 3))
	time.Sleep(50 * time.Millisecond)
	if rev := loadRevision(t, dir); rev != 1 || w.n.Load() != 1 {
		t.Fatalf("before Close: file at revision %d after %d writes, want 1 and 1 (the interval is an hour)", rev, w.n.Load())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if rev := loadRevision(t, dir); rev != 3 || w.n.Load() != 2 {
		t.Errorf("after Close: file at revision %d after %d writes, want 3 and 2", rev, w.n.Load())
	}
	// After Close an update is written at once: nothing would write it later.
	s.Update(stateAt(t, 4))
	if rev := loadRevision(t, dir); rev != 4 {
		t.Errorf("an update after Close: file at revision %d, want 4", rev)
	}
}

func TestSaverRetriesAFailedWriteAndCountsIt(t *testing.T) {
	dir := t.TempDir()
	var w countingWrite
	w.fail.Store(2)
	var logs bytes.Buffer
	var logMu sync.Mutex
	s := NewSaver(dir, 20*time.Millisecond, slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)))
	s.SetWriteFunc(w.write)
	s.Update(stateAt(t, 7))
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().Writes == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if rev := loadRevision(t, dir); rev != 7 {
		t.Errorf("file at revision %d, want 7 (written on a retry)", rev)
	}
	if st := s.Stats(); st.Errors != 2 || st.Writes != 1 {
		t.Errorf("stats = %+v, want 2 errors and 1 write", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := bytes.Count(logs.Bytes(), []byte("cannot persist broker state")); n != 1 {
		t.Errorf("the failure was logged %d times at error level, want once:\n%s", n, logs.String())
	}
	if !bytes.Contains(logs.Bytes(), []byte("disk full")) || !bytes.Contains(logs.Bytes(), []byte("persisted again")) {
		t.Errorf("log lacks the error or the recovery:\n%s", logs.String())
	}
}

func TestSaverCloseReturnsTheLastWriteError(t *testing.T) {
	dir := t.TempDir()
	var w countingWrite
	s := NewSaver(dir, time.Hour, slog.New(slog.DiscardHandler))
	s.SetWriteFunc(w.write)
	s.Update(stateAt(t, 1))
	for s.Stats().Writes == 0 {
		time.Sleep(time.Millisecond)
	}
	w.fail.Store(1)
	s.Update(stateAt(t, 2))
	if err := s.Close(); err == nil || !bytes.Contains([]byte(err.Error()), []byte("disk full")) {
		t.Errorf("Close = %v, want the write's error", err)
	}
}

// The file is always one whole state, never a torn one, and never goes back to an older revision,
// however a reader's timing falls against the writes.
func TestSaverFileIsAlwaysACompleteState(t *testing.T) {
	dir := t.TempDir()
	s := NewSaver(dir, time.Millisecond, slog.Default())
	s.Update(stateAt(t, 1))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var reads, bad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	wg.Go(func() {
		last := uint64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := Load(dir)
			reads.Add(1)
			switch {
			case err != nil || st == nil:
				bad.Add(1)
				firstBad.CompareAndSwap(nil, fmt.Sprintf("load: %v", err))
			case st.Revision < last:
				bad.Add(1)
				firstBad.CompareAndSwap(nil, fmt.Sprintf("revision went back from %d to %d", last, st.Revision))
			case len(st.Clusters) != 5 || len(st.Endpoints) != 5:
				bad.Add(1)
				firstBad.CompareAndSwap(nil, fmt.Sprintf("partial state: %d clusters, %d endpoints", len(st.Clusters), len(st.Endpoints)))
			default:
				last = st.Revision
			}
		}
	})
	for rev := uint64(2); rev <= 300; rev++ {
		s.Update(stateAt(t, rev))
		if rev%20 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d of %d reads saw a bad file; first: %v", bad.Load(), reads.Load(), firstBad.Load())
	}
	if rev := loadRevision(t, dir); rev != 300 {
		t.Errorf("file at revision %d, want 300", rev)
	}
	if st := s.Stats(); st.Writes < 2 || st.Writes >= 300 {
		t.Errorf("%d writes for 300 updates: want coalesced, and more than the first", st.Writes)
	}
}

// An Update keeps its own copy of the state's fields: the agent sets Revision to 0 on the state it
// holds after a message it cannot apply, and that must not reach the file.
func TestSaverKeepsTheStateAsUpdated(t *testing.T) {
	dir := t.TempDir()
	s := NewSaver(dir, time.Hour, slog.Default())
	s.Update(stateAt(t, 1))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	st := stateAt(t, 9)
	s.Update(st)
	st.Revision = 0
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if rev := loadRevision(t, dir); rev != 9 {
		t.Errorf("file at revision %d, want 9", rev)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
