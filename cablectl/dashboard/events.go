package dashboard

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MaxEvents is how many recent events the dashboard keeps (the newest first).
const MaxEvents = 200

// Diff lists what changed from prev to next, the events of the events page: pairs going up or
// down, failovers (another gateway serving a pair at one end), policy changes, clusters and
// gateways coming and going, and the broker's answering. Pure: the poller calls it on each new
// document.
func Diff(prev, next *Mesh, now time.Time) []Event {
	var out []Event
	add := func(kind, subject, format string, a ...any) {
		out = append(out, Event{Time: now.UTC(), Kind: kind, Subject: subject, Message: fmt.Sprintf(format, a...)})
	}
	if prev.Error != next.Error {
		if next.Error != "" {
			add(EventBroker, "broker", "the broker does not answer: %s", next.Error)
		} else {
			add(EventBroker, "broker", "the broker answers again")
		}
	}
	if next.Error != "" {
		return out // next holds prev's data: nothing else is news
	}
	diffClusters(prev.Clusters, next.Clusters, add)
	diffPairs(prev.Pairs, next.Pairs, add)
	diffPolicies(prev.Policies, next.Policies, add)
	return out
}

type addFunc func(kind, subject, format string, a ...any)

func diffClusters(prev, next []Cluster, add addFunc) {
	before := map[string]Cluster{}
	for _, c := range prev {
		before[c.Name] = c
	}
	for _, c := range next {
		old, ok := before[c.Name]
		delete(before, c.Name)
		if !ok {
			add(EventCluster, c.Name, "cluster %s joined (ID %d, %d/%d gateways online)", c.Name, c.ID, c.GatewaysOnline, c.GatewaysTotal)
			continue
		}
		was := map[string]bool{}
		for _, g := range old.Gateways {
			was[g.Node] = g.Online
		}
		for _, g := range c.Gateways {
			if on, known := was[g.Node]; !known || on != g.Online {
				add(EventCluster, c.Name+"/"+g.Node, "gateway %s of %s %s (%d/%d online)", g.Node, c.Name, onlineWord(g.Online), c.GatewaysOnline, c.GatewaysTotal)
			}
		}
	}
	for _, c := range sortedKeys(before) {
		add(EventCluster, c, "cluster %s left the mesh", c)
	}
}

func onlineWord(on bool) string {
	if on {
		return "came online"
	}
	return "went offline"
}

func diffPairs(prev, next []Pair, add addFunc) {
	before := map[pairKey]Pair{}
	for _, p := range prev {
		before[p.Clusters] = p
	}
	for _, p := range next {
		old, ok := before[p.Clusters]
		if !ok {
			continue // a new cluster's pairs: its join is the event
		}
		name := p.Clusters[0] + "–" + p.Clusters[1]
		switch {
		case old.State == p.State:
		case p.State == StateConnected:
			add(EventPairUp, name, "%s is up: %s", name, p.Reason)
		case p.State == StateDown:
			add(EventPairDown, name, "%s is down: %s", name, p.Reason)
		default:
			add(EventPairChanged, name, "%s: %s → %s: %s", name, old.State, p.State, p.Reason)
		}
		if old.Policy != p.Policy || old.Connect != p.Connect {
			add(EventPolicy, name, "%s is now decided by %s: %s", name, orDash(p.Policy), connectWords(p.Connect, p.Driver))
		} else if old.Driver != p.Driver && old.Driver != "" && p.Driver != "" {
			add(EventPairChanged, name, "%s moved from %s to %s", name, old.Driver, p.Driver)
		}
		for _, f := range failovers(old.Nodes, p.Nodes) {
			add(EventFailover, name, "%s: %s", name, f)
		}
	}
}

// failovers compares the gateways serving a pair before and after, per cluster: "east: gw1 →
// gw2" for each end whose node changed.
func failovers(before, after []string) []string {
	was := map[string]string{}
	for _, n := range before {
		c, node, _ := strings.Cut(n, "/")
		was[c] = node
	}
	var out []string
	for _, n := range after {
		c, node, _ := strings.Cut(n, "/")
		if old, ok := was[c]; ok && old != node {
			out = append(out, fmt.Sprintf("%s's gateway %s took over from %s", c, node, old))
		}
	}
	return out
}

func connectWords(connect bool, driver string) string {
	if !connect {
		return "no connection"
	}
	return "connect over " + orDash(driver)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func diffPolicies(prev, next []Policy, add addFunc) {
	before := map[string]Policy{}
	for _, p := range prev {
		before[p.Name] = p
	}
	for _, p := range next {
		old, ok := before[p.Name]
		delete(before, p.Name)
		switch {
		case !ok:
			add(EventPolicy, p.Name, "policy %s (%s, priority %d) applied", p.Name, p.Origin, p.Priority)
		case !sameSpec(old, p):
			add(EventPolicy, p.Name, "policy %s (%s) changed", p.Name, p.Origin)
		}
	}
	for _, name := range sortedKeys(before) {
		add(EventPolicy, name, "policy %s (%s) deleted", name, before[name].Origin)
	}
}

func sameSpec(a, b Policy) bool {
	ja, _ := json.Marshal(a.Spec)
	jb, _ := json.Marshal(b.Spec)
	return string(ja) == string(jb)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
