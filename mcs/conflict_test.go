package mcs

import (
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestConflictServiceSplitsWhatConflictsOfJoins(t *testing.T) {
	imps := []*apiv1.ServiceImport{{Namespace: "shop", Name: "web", Conflicts: []*apiv1.ServiceConflict{
		{Cluster: "west", Field: "ports", Message: "port 80/TCP: named http here, web elsewhere"},
	}}}
	got := ConflictsOf("west", imps)
	if len(got) != 1 {
		t.Fatalf("ConflictsOf: %d conflicts, want 1", len(got))
	}
	key, reason, ok := ConflictService(got[0].GetMessage())
	if !ok || key != "shop/web" || reason != "port 80/TCP: named http here, web elsewhere" {
		t.Fatalf("ConflictService(%q) = %q, %q, %v", got[0].GetMessage(), key, reason, ok)
	}
}

func TestConflictServiceRefusesAMessageWithoutAKey(t *testing.T) {
	for _, msg := range []string{"", "no key here", "web: no namespace", "/web: empty namespace", "shop/: empty name",
		"a/b/c: too many parts", "sh op/web: a space"} {
		if key, _, ok := ConflictService(msg); ok {
			t.Errorf("ConflictService(%q) took %q as a key", msg, key)
		}
	}
}

func FuzzConflictService(f *testing.F) {
	f.Add("shop/web: exported as Headless")
	f.Add("x: y")
	f.Fuzz(func(t *testing.T, msg string) {
		key, reason, ok := ConflictService(msg)
		if !ok {
			return
		}
		if key+": "+reason != msg {
			t.Fatalf("ConflictService(%q) = %q, %q: does not join back", msg, key, reason)
		}
		if strings.Count(key, "/") != 1 {
			t.Fatalf("key %q is not namespace/name", key)
		}
	})
}
