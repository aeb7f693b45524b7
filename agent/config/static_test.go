package config

import (
	"reflect"
	"slices"
	"testing"
)

// No field of Static may be one a reload applies: the agent reads Static as fixed for its life.
func TestStaticHoldsNoLiveField(t *testing.T) {
	live := LiveFields()
	for _, f := range staticFields {
		if slices.Contains(live, f) {
			t.Errorf("Static holds %s, which a reload changes", f)
		}
	}
	if n := reflect.TypeFor[Static]().NumField(); n != len(staticFields) {
		t.Errorf("Static has %d fields, staticFields names %d", n, len(staticFields))
	}
}

// A reload that changes a Static field is refused.
func TestAChangedStaticFieldIsRefused(t *testing.T) {
	cur := &Config{Cluster: "east", Node: "gw1", Gateway: true}
	next := *cur
	next.Gateway = false
	if p := Diff(cur, &next); len(p.Refused) != 1 || p.Refused[0].Field != "gateway" {
		t.Fatalf("gateway changed: refused %v, want gateway", p.Refused)
	}
}
