package cable

import (
	"errors"
	"strings"
	"testing"
)

// TestASpecWithoutADatapathValidatesButDoesNotBuild: a program that links only a driver's spec
// (the broker) lists it, checks its settings, options and attributes, and refuses to build it.
func TestASpecWithoutADatapathValidatesButDoesNotBuild(t *testing.T) {
	const name = "test-spec-only"
	refused := errors.New("publishes no key")
	RegisterSpec(Spec{Name: name, CheckPublished: func(map[string]string) error { return refused }})
	if _, ok := LookupSpec(name); !ok {
		t.Fatalf("LookupSpec(%q) found nothing", name)
	}
	if _, ok := Lookup(name); ok {
		t.Errorf("Lookup(%q) reports a datapath that was never registered", name)
	}
	found := false
	for _, n := range Names() {
		found = found || n == name
	}
	if !found {
		t.Errorf("Names() = %v, want it to list %s", Names(), name)
	}
	if err := CheckPublished(name, nil); !errors.Is(err, refused) {
		t.Errorf("CheckPublished = %v, want the spec's error", err)
	}
	if err := ValidateOptions(name, Options{"mtu": "1400"}); err == nil || !strings.Contains(err.Error(), `mtu="1400"`) {
		t.Errorf("ValidateOptions of a spec without options = %v, want an error naming mtu and 1400", err)
	}
	if _, err := New(name, LocalNode{}, nil); err == nil || !strings.Contains(err.Error(), "datapath") {
		t.Errorf("New of a spec-only driver = %v, want an error saying its datapath is not linked", err)
	}
}

// TestRegisterCompletesItsSpec: a datapath registered after its spec takes the spec's checks,
// and one registered without a spec (a test fake) makes its own from its fields.
func TestRegisterCompletesItsSpec(t *testing.T) {
	const withSpec, fake = "test-with-spec", "test-fake"
	RegisterSpec(Spec{Name: withSpec, OptIn: true, ValidateOptions: func(Options) error { return errors.New("from the spec") }})
	build := func(LocalNode, Settings) (Driver, error) { return nil, errors.New("built") }
	Register(Registration{Name: withSpec, New: build})
	Register(Registration{Name: fake, New: build, CheckPublished: func(map[string]string) error { return errors.New("from the fake") }})

	r, ok := Lookup(withSpec)
	if !ok || !r.OptIn || r.ValidateOptions == nil || r.ValidateOptions(nil).Error() != "from the spec" {
		t.Errorf("Lookup(%q) = %+v, %v: want the spec's OptIn and ValidateOptions", withSpec, r, ok)
	}
	if err := CheckPublished(fake, nil); err == nil || err.Error() != "from the fake" {
		t.Errorf("CheckPublished(%q) = %v, want the registration's check", fake, err)
	}
	if _, err := New(withSpec, LocalNode{}, nil); err == nil || err.Error() != "built" {
		t.Errorf("New(%q) = %v, want the registered factory's result", withSpec, err)
	}
	for _, n := range DefaultNames() {
		if n == withSpec {
			t.Errorf("DefaultNames() = %v lists the opt-in %s", DefaultNames(), withSpec)
		}
	}
}
