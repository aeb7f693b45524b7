package health

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// outcome is one probe: ok, or a timeout.
type outcome bool

const (
	answered outcome = true
	lost     outcome = false
)

func TestUsableHoldsARecoveredTargetBack(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const period, hold, threshold = 300 * time.Millisecond, time.Second, 3
	tests := []struct {
		name   string
		probes []outcome
		// at is how long after the last probe Usable is asked.
		at         time.Duration
		hold       time.Duration
		wantUsable bool
	}{
		{"a target that only answered is usable at once", []outcome{answered}, 0, hold, true},
		{"a target with failures below the threshold stays usable", []outcome{answered, lost, lost}, 0, hold, true},
		{"a target at the threshold is not usable", []outcome{answered, lost, lost, lost}, 0, hold, false},
		{"a target that answers again is held back before the hold", []outcome{answered, lost, lost, lost, answered, answered}, 0, hold, false},
		{"a target that answered for the hold is usable again", []outcome{answered, lost, lost, lost, answered}, hold, hold, true},
		{"a failure during the hold restarts it", []outcome{answered, lost, lost, lost, answered, answered, answered, lost, answered}, hold - period, hold, false},
		{"without a hold one answer recovers", []outcome{answered, lost, lost, lost, answered}, 0, 0, true},
		{"a target that never answered and failed below the threshold is usable", []outcome{lost}, 0, hold, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Result
			w := NewWindow(8)
			now := t0
			for i, o := range tt.probes {
				now = t0.Add(time.Duration(i) * period)
				var err error
				if o == lost {
					err = &TimeoutError{After: period}
				}
				r.record(now, time.Millisecond, err, threshold, w)
			}
			if got := r.Usable(threshold, tt.hold, now.Add(tt.at)); got != tt.wantUsable {
				t.Errorf("Usable after %v and %v more = %v, want %v (result %+v)", tt.probes, tt.at, got, tt.wantUsable, r)
			}
			holding := r.Holding(threshold, tt.hold, now.Add(tt.at))
			if wantHolding := r.Healthy(threshold) && !tt.wantUsable; holding != wantHolding {
				t.Errorf("Holding = %v, want %v", holding, wantHolding)
			}
		})
	}
}

func TestRecordMarksWhenTheTargetWentDown(t *testing.T) {
	var r Result
	w := NewWindow(8)
	t0 := time.Unix(100, 0)
	timeout := errors.New("timeout")
	for i := range 5 {
		r.record(t0.Add(time.Duration(i)*time.Second), 0, timeout, 3, w)
	}
	if want := t0.Add(2 * time.Second); !r.LastDown.Equal(want) {
		t.Errorf("LastDown = %v, want the third failure's time %v", r.LastDown, want)
	}
	if !r.UpSince.IsZero() {
		t.Errorf("UpSince = %v after failures only, want zero", r.UpSince)
	}
}

func TestOnChangeWithAHoldFiresWhenTheHoldHasPassed(t *testing.T) {
	n := newFakeNet()
	const hold = 150 * time.Millisecond
	m := NewManager(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 3, RecoveryHold: hold}, n.newPinger, nil, quiet)
	defer m.Close()
	var mu sync.Mutex
	var calls []string
	var backAt time.Time
	m.OnChange(func(cluster string, usable bool) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("%s=%v", cluster, usable))
		if usable {
			backAt = time.Now()
		}
	})
	west := target("west", "10.2.0.1")
	m.Sync([]Target{west})
	eventually(t, "west answers", func() bool { r, _ := m.Result("west"); return r.Sent >= 2 })
	n.setDown(west.Destination, true)
	eventually(t, "a call saying west is down", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 1 })
	upAt := time.Now()
	n.setDown(west.Destination, false)
	eventually(t, "a call saying west is usable", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if calls[0] != "west=false" || calls[1] != "west=true" {
		t.Errorf("calls %v, want west=false then west=true", calls)
	}
	if d := backAt.Sub(upAt); d < hold {
		t.Errorf("west usable again %v after it answered, want at least the hold %v", d, hold)
	}
}

func TestATargetThatStartsDownIsUsableOnlyAfterTheHold(t *testing.T) {
	n := newFakeNet()
	const hold = 100 * time.Millisecond
	m := NewManager(Settings{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 3, RecoveryHold: hold}, n.newPinger, nil, quiet)
	defer m.Close()
	usable := make(chan time.Time, 4)
	m.OnChange(func(_ string, ok bool) {
		if ok {
			usable <- time.Now()
		}
	})
	west := target("west", "10.2.0.1")
	west.StartDown = true
	started := time.Now()
	m.Sync([]Target{west})
	select {
	case at := <-usable:
		if d := at.Sub(started); d < hold {
			t.Errorf("a target that started down was usable %v after it started answering, want at least the hold %v", d, hold)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a target that started down and answers never became usable")
	}
	r, _ := m.Result("west")
	if !r.Usable(3, hold, time.Now()) {
		t.Errorf("result %+v is not usable after the call", r)
	}
}
