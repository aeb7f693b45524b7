package cable

import (
	"fmt"
	"sort"
	"sync"
)

// Factory builds a driver for the local node with its settings. It must validate settings and
// return an error naming the bad key and value; it must not touch the host (Init does).
type Factory func(node LocalNode, settings Settings) (Driver, error)

// Registration is a driver's datapath: how to build it, and what its process needs. A datapath
// package registers only Name, New and PrepareProcess: the rest comes from the spec of the same
// name, which it imports. The spec fields here are for a driver without a spec package (test
// fakes): Register then makes its Spec from them, or, when a spec exists, lets the non-nil ones
// replace the spec's.
type Registration struct {
	// Name is the registry key, the driver's name in policies, the agent config and endpoints.
	Name string
	// New builds the driver.
	New Factory
	// ParseSettings, ValidateOptions, CheckPublished and OptIn are Spec's.
	ParseSettings   func(Settings) error
	ValidateOptions func(Options) error
	CheckPublished  func(attrs map[string]string) error
	OptIn           bool
	// PrepareProcess, when set, runs first thing in the agent's main, before anything else, for
	// drivers that need the process set up in a way only a re-execution can give (wireguard's
	// private mount namespace for its UAPI sockets). It reports parentDone with the exit code
	// when the process only waited for its re-executed child, which then did the work.
	PrepareProcess func() (parentDone bool, exitCode int, err error)
}

var (
	mu            sync.RWMutex
	specs         = map[string]Spec{}
	registrations = map[string]Registration{}
)

// RegisterSpec adds a driver's spec. It panics on a duplicate or empty name: those are
// programming errors caught at init.
func RegisterSpec(s Spec) {
	mu.Lock()
	defer mu.Unlock()
	if s.Name == "" {
		panic("cable: driver spec without a name")
	}
	if _, dup := specs[s.Name]; dup {
		panic(fmt.Sprintf("cable: driver spec %q registered twice", s.Name))
	}
	specs[s.Name] = s
}

// Register adds a driver's datapath (see Registration). It panics on a duplicate or empty name
// or a missing factory: those are programming errors caught at init.
func Register(r Registration) {
	mu.Lock()
	defer mu.Unlock()
	if r.Name == "" || r.New == nil {
		panic(fmt.Sprintf("cable: driver registration %q without a name or a factory", r.Name))
	}
	if _, dup := registrations[r.Name]; dup {
		panic(fmt.Sprintf("cable: driver %q registered twice", r.Name))
	}
	specs[r.Name] = r.mergeInto(specs[r.Name])
	registrations[r.Name] = r
}

// mergeInto is s with the spec fields r sets replacing its own.
func (r Registration) mergeInto(s Spec) Spec {
	s.Name = r.Name
	if r.ParseSettings != nil {
		s.ParseSettings = r.ParseSettings
	}
	if r.ValidateOptions != nil {
		s.ValidateOptions = r.ValidateOptions
	}
	if r.CheckPublished != nil {
		s.CheckPublished = r.CheckPublished
	}
	s.OptIn = s.OptIn || r.OptIn
	return s
}

// LookupSpec returns the spec of name.
func LookupSpec(name string) (Spec, bool) {
	mu.RLock()
	defer mu.RUnlock()
	s, ok := specs[name]
	return s, ok
}

// Lookup returns the datapath registration of name, with its spec's fields filled in. It
// reports false for a driver whose datapath this program does not link, even if its spec is.
func Lookup(name string) (Registration, bool) {
	mu.RLock()
	defer mu.RUnlock()
	r, ok := registrations[name]
	if !ok {
		return Registration{}, false
	}
	s := specs[name]
	r.ParseSettings, r.ValidateOptions, r.CheckPublished, r.OptIn = s.ParseSettings, s.ValidateOptions, s.CheckPublished, s.OptIn
	return r, true
}

func lookupSpec(name string) (Spec, error) {
	s, ok := LookupSpec(name)
	if !ok {
		return Spec{}, fmt.Errorf("cable driver %q is not registered (have %v)", name, Names())
	}
	return s, nil
}

// New builds the driver registered under name.
func New(name string, node LocalNode, settings Settings) (Driver, error) {
	if _, err := lookupSpec(name); err != nil {
		return nil, err
	}
	r, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("cable driver %q: this program links only its spec, not its datapath", name)
	}
	return r.New(node, settings)
}

// ParseSettings validates settings for driver name (see Spec.ParseSettings).
func ParseSettings(name string, s Settings) error {
	spec, err := lookupSpec(name)
	if err != nil {
		return err
	}
	if spec.ParseSettings == nil {
		for k, v := range s {
			return fmt.Errorf("%s.%s: %q: the %s driver takes no settings", name, k, v, name)
		}
		return nil
	}
	return spec.ParseSettings(s)
}

// ValidateOptions validates per-connection options for driver name (see
// Spec.ValidateOptions).
func ValidateOptions(name string, o Options) error {
	spec, err := lookupSpec(name)
	if err != nil {
		return err
	}
	if spec.ValidateOptions == nil {
		for k, v := range o {
			return fmt.Errorf("%s option %s=%q: unknown key (the %s driver takes no per-connection options)", name, k, v, name)
		}
		return nil
	}
	return spec.ValidateOptions(o)
}

// CheckPublished validates a remote node's attributes for driver name (see
// Spec.CheckPublished). An unregistered driver is an error.
func CheckPublished(name string, attrs map[string]string) error {
	spec, err := lookupSpec(name)
	if err != nil {
		return err
	}
	if spec.CheckPublished == nil {
		return nil
	}
	return spec.CheckPublished(attrs)
}

// Specs lists the registered specs, sorted by name.
func Specs() []Spec {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Spec, 0, len(specs))
	for _, s := range specs {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names lists the registered drivers (their specs), sorted.
func Names() []string {
	all := Specs()
	names := make([]string, 0, len(all))
	for _, s := range all {
		names = append(names, s.Name)
	}
	return names
}

// DefaultNames are the registered drivers an agent runs when its config does not list
// cableDrivers: every driver but the opt-in ones, sorted.
func DefaultNames() []string {
	var names []string
	for _, s := range Specs() {
		if !s.OptIn {
			names = append(names, s.Name)
		}
	}
	return names
}

// PrepareProcess runs every registered datapath's PrepareProcess hook, in name order, and stops
// at the first that reports parentDone (main must then exit with exitCode) or fails.
func PrepareProcess() (parentDone bool, exitCode int, err error) {
	for _, name := range Names() {
		r, ok := Lookup(name)
		if !ok || r.PrepareProcess == nil {
			continue
		}
		done, code, err := r.PrepareProcess()
		if err != nil {
			return false, 0, fmt.Errorf("prepare the process for cable driver %s: %w", name, err)
		}
		if done {
			return true, code, nil
		}
	}
	return false, 0, nil
}
