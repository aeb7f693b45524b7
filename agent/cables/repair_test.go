package cables

import (
	"maps"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable"
)

func TestPlanRepairs(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	const interval = 30 * time.Second
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	reason := func(n int) string {
		return map[int]string{
			3: "health probes failed 3 times in a row; re-asserting the connection",
			7: "health probes failed 7 times in a row; re-asserting the connection",
		}[n]
	}
	tests := []struct {
		name      string
		unhealthy map[string]int
		last      map[string]time.Time
		wanted    map[string]bool
		wantDue   map[string]string
		wantLast  map[string]time.Time
	}{
		{name: "nothing is repaired when every pair is healthy",
			wanted: map[string]bool{"west": true}, wantLast: map[string]time.Time{}},
		{name: "an unhealthy pair never repaired is repaired now and stamped",
			unhealthy: map[string]int{"west": 3}, wanted: map[string]bool{"west": true},
			wantDue: map[string]string{"west": reason(3)}, wantLast: map[string]time.Time{"west": now}},
		{name: "an unhealthy pair repaired within the interval waits",
			unhealthy: map[string]int{"west": 7}, last: map[string]time.Time{"west": ago(interval - time.Second)}, wanted: map[string]bool{"west": true},
			wantLast: map[string]time.Time{"west": ago(interval - time.Second)}},
		{name: "an unhealthy pair repaired exactly one interval ago is repaired again",
			unhealthy: map[string]int{"west": 7}, last: map[string]time.Time{"west": ago(interval)}, wanted: map[string]bool{"west": true},
			wantDue: map[string]string{"west": reason(7)}, wantLast: map[string]time.Time{"west": now}},
		{name: "each pair keeps its own interval",
			unhealthy: map[string]int{"west": 3, "north": 3}, last: map[string]time.Time{"west": ago(time.Second), "north": ago(time.Minute)},
			wanted:  map[string]bool{"west": true, "north": true},
			wantDue: map[string]string{"north": reason(3)}, wantLast: map[string]time.Time{"west": ago(time.Second), "north": now}},
		{name: "an unhealthy pair that is no longer wanted is not repaired",
			unhealthy: map[string]int{"west": 3}, wanted: map[string]bool{}, wantLast: map[string]time.Time{}},
		{name: "a pair no longer wanted is forgotten, so it starts afresh when wanted again",
			last: map[string]time.Time{"west": ago(time.Second), "north": ago(time.Second)}, wanted: map[string]bool{"north": true},
			wantLast: map[string]time.Time{"north": ago(time.Second)}},
		{name: "a healthy pair keeps the time of its last repair",
			last: map[string]time.Time{"west": ago(time.Second)}, wanted: map[string]bool{"west": true},
			wantLast: map[string]time.Time{"west": ago(time.Second)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lastBefore := maps.Clone(tt.last)
			due, next := planRepairs(tt.unhealthy, tt.last, tt.wanted, now, interval)
			if !maps.Equal(due, tt.wantDue) {
				t.Errorf("due = %v, want %v", due, tt.wantDue)
			}
			if !maps.Equal(next, tt.wantLast) {
				t.Errorf("nextLast = %v, want %v", next, tt.wantLast)
			}
			if !maps.Equal(tt.last, lastBefore) {
				t.Errorf("planRepairs modified last: %v, was %v", tt.last, lastBefore)
			}
		})
	}
}

func TestUnhealthyPairs(t *testing.T) {
	want := func(cluster, node string) reconcile.Want {
		return reconcile.Want{Remote: cable.RemoteEndpoint{Cluster: cluster, Node: node}, Driver: "wireguard"}
	}
	result := func(node string, failures int) health.Result {
		return health.Result{Target: health.Target{Node: node}, ConsecutiveFailures: failures}
	}
	tests := []struct {
		name    string
		wants   map[string]reconcile.Want
		results map[string]health.Result
		want    map[string]int
	}{
		{name: "a pair whose probes failed the threshold times is unhealthy, with the count",
			wants: map[string]reconcile.Want{"west": want("west", "w1")}, results: map[string]health.Result{"west": result("w1", 4)},
			want: map[string]int{"west": 4}},
		{name: "a pair below the threshold is healthy",
			wants: map[string]reconcile.Want{"west": want("west", "w1")}, results: map[string]health.Result{"west": result("w1", 2)},
			want: map[string]int{}},
		{name: "a pair not probed is not unhealthy",
			wants: map[string]reconcile.Want{"west": want("west", "w1")}, want: map[string]int{}},
		{name: "probes aimed at another node of the cluster say nothing about the wanted one",
			wants: map[string]reconcile.Want{"west": want("west", "w2")}, results: map[string]health.Result{"west": result("w1", 9)},
			want: map[string]int{}},
		{name: "a cluster probed but not wanted is not reported",
			wants: map[string]reconcile.Want{}, results: map[string]health.Result{"west": result("w1", 9)},
			want: map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookup := func(c string) (health.Result, bool) { r, ok := tt.results[c]; return r, ok }
			if got := unhealthyPairs(tt.wants, lookup, 3); !maps.Equal(got, tt.want) {
				t.Errorf("unhealthyPairs = %v, want %v", got, tt.want)
			}
		})
	}
}
