package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// A running agent re-reads its config file when it changes (agent/reload.go). This file decides,
// without any I/O, what a new config changes and whether the agent can apply that while it runs.
//
// The rule is a list of what may change live; every other field is refused. A field added to
// Config later is therefore refused until someone decides it can be applied live: refusing a
// change the agent could have made costs a restart, applying one it cannot make would leave the
// node half on the old config and half on the new.

// liveFields are the config fields (YAML paths) a running agent applies without a restart. The
// cable drivers' blocks (`vxlan:`, `wireguard:`, ...) are live too: the driver is rebuilt.
var liveFields = map[string]string{
	"joinTokenFile":                "read only before the first join",
	"cableDrivers":                 "drivers added or removed are started or stopped",
	"logLevel":                     "the log level changes at once",
	"healthCheck.enabled":          "the probers start or stop",
	"healthCheck.period":           "the probers restart with the new settings",
	"healthCheck.timeout":          "the probers restart with the new settings",
	"healthCheck.failureThreshold": "the probers restart with the new settings",
	"healthCheck.window":           "the probers restart with the new settings",
	"dns.upstream":                 "the DNS server forwards to the new upstreams",
	"dns.ttl":                      "the DNS zone is rebuilt with the new TTL",
	"dns.allowClients":             "the DNS server answers the new clients at once",
	"exports":                      "the exports are sent to the broker again",
	"imports.selector":             "the broker watch is opened again with the new selector",
}

// LiveFields lists the fields a running agent applies without a restart, sorted (for the docs and
// tests); the drivers' blocks are live as well.
func LiveFields() []string { return slices.Sorted(maps.Keys(liveFields)) }

// Change is one field that differs between the running config and a new one.
type Change struct {
	// Field is the YAML path ("healthCheck.period", "vxlan.port", "exports").
	Field string
	// Old and New are the values, as short text.
	Old, New string
}

func (c Change) String() string { return fmt.Sprintf("%s: %s -> %s", c.Field, c.Old, c.New) }

// ReloadPlan is what a new config changes, sorted into what the agent does about each.
type ReloadPlan struct {
	// Refused are changes a running agent cannot apply; any one of them refuses the whole config.
	Refused []Change
	// Live are the changes it applies, field by field (for the log).
	Live []Change
	// Drivers are the cable drivers to rebuild (their block changed) or to start or stop
	// (cableDrivers changed), sorted.
	Drivers []string
	// Exports, Health, DNS, LogLevel and Imports (imports.selector) say which of those parts
	// changed.
	Exports, Health, DNS, LogLevel, Imports bool
}

// Empty reports whether the new config changes nothing.
func (p ReloadPlan) Empty() bool { return len(p.Refused) == 0 && len(p.Live) == 0 }

// Diff compares the running config with a new one (both defaulted and validated) and says what
// changed. It is pure.
func Diff(old, next *Config) ReloadPlan {
	var changes []Change
	diffStruct(reflect.ValueOf(*old), reflect.ValueOf(*next), "", &changes)
	// The drivers' blocks hold what the operator wrote; a block added or removed, or a setting
	// changed, rebuilds that driver.
	names := map[string]bool{}
	for n := range old.Drivers {
		names[n] = true
	}
	for n := range next.Drivers {
		names[n] = true
	}
	var p ReloadPlan
	drivers := map[string]bool{}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		o, nw := old.Drivers[n], next.Drivers[n]
		for _, k := range slices.Sorted(maps.Keys(union(o, nw))) {
			ov, ook := o[k]
			nv, nok := nw[k]
			if ook == nok && ov == nv {
				continue
			}
			p.Live = append(p.Live, Change{Field: n + "." + k, Old: settingText(ov, ook), New: settingText(nv, nok)})
			drivers[n] = true
		}
	}
	for _, c := range changes {
		if _, ok := liveFields[c.Field]; !ok {
			p.Refused = append(p.Refused, c)
			continue
		}
		p.Live = append(p.Live, c)
		switch {
		case c.Field == "cableDrivers":
			// Only the drivers that come or go; a new order alone changes nothing that runs.
			for _, d := range symmetricDifference(old.CableDrivers, next.CableDrivers) {
				drivers[d] = true
			}
		case c.Field == "exports":
			p.Exports = true
		case strings.HasPrefix(c.Field, "healthCheck."):
			p.Health = true
		case strings.HasPrefix(c.Field, "dns."):
			p.DNS = true
		case c.Field == "logLevel":
			p.LogLevel = true
		case c.Field == "imports.selector":
			p.Imports = true
		}
	}
	// A driver that neither runs before nor after (a block for a driver cableDrivers leaves
	// out) needs no rebuild.
	for d := range drivers {
		if !slices.Contains(old.CableDrivers, d) && !slices.Contains(next.CableDrivers, d) {
			delete(drivers, d)
		}
	}
	p.Drivers = slices.Sorted(maps.Keys(drivers))
	return p
}

// RefusedMessage is what the agent logs and reports for a refused change.
func RefusedMessage(c Change) string {
	return fmt.Sprintf("%s cannot change while the agent runs (running %s, file has %s); the whole new config is refused and the running one kept: restore the field, or restart the agent to apply it", c.Field, c.Old, c.New)
}

// diffStruct appends a Change for every field of the config structs that differs, by YAML path;
// nested config structs are walked, anything else is compared whole.
func diffStruct(o, n reflect.Value, prefix string, out *[]Change) {
	t := o.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		path := prefix + name
		ov, nv := o.Field(i), n.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Time]() {
			diffStruct(ov, nv, path+".", out)
			continue
		}
		if reflect.DeepEqual(ov.Interface(), nv.Interface()) {
			continue
		}
		// An empty list and no list are the same config.
		if (ov.Kind() == reflect.Slice || ov.Kind() == reflect.Map) && ov.Len() == 0 && nv.Len() == 0 {
			continue
		}
		*out = append(*out, Change{Field: path, Old: valueText(ov), New: valueText(nv)})
	}
}

// maxValueText bounds a value in a message: an exports list can be long.
const maxValueText = 160

// valueText is a value as a message shows it: durations as Go durations, pointers by what they
// point at, lists and maps as JSON.
func valueText(v reflect.Value) string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "(unset)"
		}
		v = v.Elem()
	}
	var s string
	switch x := v.Interface().(type) {
	case time.Duration:
		s = x.String()
	case string:
		s = fmt.Sprintf("%q", x)
	default:
		if v.Kind() == reflect.Slice || v.Kind() == reflect.Map || v.Kind() == reflect.Struct {
			b, err := json.Marshal(x)
			if err != nil {
				s = fmt.Sprint(x)
			} else {
				s = string(b)
			}
		} else {
			s = fmt.Sprint(x)
		}
	}
	if len(s) > maxValueText {
		s = s[:maxValueText] + "..."
	}
	return s
}

func settingText(v string, ok bool) string {
	if !ok {
		return "(unset)"
	}
	return fmt.Sprintf("%q", v)
}

func union[M ~map[string]string](a, b M) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// symmetricDifference is what is in one list and not in the other.
func symmetricDifference(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, x)
		}
	}
	return out
}
