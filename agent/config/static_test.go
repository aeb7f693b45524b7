package config

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// leaves are the fields of a config struct by YAML path, nested structs walked (as Diff walks
// them); a field the YAML decoder skips (the drivers' blocks) goes by its JSON name.
func leaves(v reflect.Value, prefix string, out map[string]reflect.Value) map[string]reflect.Value {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			name, _, _ = strings.Cut(f.Tag.Get("json"), ",")
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Time]() {
			leaves(v.Field(i), prefix+name+".", out)
			continue
		}
		out[prefix+name] = v.Field(i)
	}
	return out
}

func leavesOf(x any) map[string]reflect.Value {
	return leaves(reflect.ValueOf(x).Elem(), "", map[string]reflect.Value{})
}

// nonZero is a value of t that is not its zero value.
func nonZero(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	switch t.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		v.Set(reflect.Append(v, nonZero(t.Elem())))
	case reflect.Map:
		v.Set(reflect.MakeMap(t))
		v.SetMapIndex(nonZero(t.Key()), nonZero(t.Elem()))
	case reflect.Pointer:
		v.Set(reflect.New(t.Elem()))
		v.Elem().Set(nonZero(t.Elem()))
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if t.Field(i).IsExported() {
				v.Field(i).Set(nonZero(t.Field(i).Type))
			}
		}
	default:
		panic("nonZero: no value for " + t.String())
	}
	return v
}

// Every field of the file is in Static or in Live, never in both, under the same path and with
// the same type: a field added to Config and to neither fails here.
func TestEveryFieldIsStaticOrLive(t *testing.T) {
	all := leavesOf(&Config{})
	static, live := leavesOf(&Static{}), leavesOf(&Live{})
	for p, v := range all {
		s, inStatic := static[p]
		l, inLive := live[p]
		switch {
		case inStatic && inLive:
			t.Errorf("%s is in both Static and Live", p)
		case !inStatic && !inLive:
			t.Errorf("%s is in neither Static nor Live: decide whether a reload may change it", p)
		case inStatic && s.Type() != v.Type():
			t.Errorf("Static's %s is a %s, Config's a %s", p, s.Type(), v.Type())
		case inLive && l.Type() != v.Type():
			t.Errorf("Live's %s is a %s, Config's a %s", p, l.Type(), v.Type())
		}
	}
	for _, part := range []map[string]reflect.Value{static, live} {
		for p := range part {
			if _, ok := all[p]; !ok {
				t.Errorf("%s is no field of Config", p)
			}
		}
	}
}

// Live holds exactly the fields a reload applies (and the drivers' blocks, which it applies
// too), so no field of Static is one a reload changes.
func TestStaticHoldsNoLiveField(t *testing.T) {
	live := slices.Sorted(maps.Keys(leavesOf(&Live{})))
	want := slices.Sorted(slices.Values(append(LiveFields(), "drivers")))
	if !slices.Equal(live, want) {
		t.Errorf("Live holds %v; the fields a reload applies are %v", live, want)
	}
	for p := range leavesOf(&Static{}) {
		if slices.Contains(want, p) {
			t.Errorf("Static holds %s, which a reload changes", p)
		}
	}
}

// Static and Live carry each field's value from the Config, and each field a config sets only
// to its own place: a config that sets one field shows it in one place of the two parts alone,
// and a reload refuses it exactly when that place is Static.
func TestStaticAndLiveCarryEachField(t *testing.T) {
	for p, f := range leavesOf(&Config{}) {
		t.Run(p, func(t *testing.T) {
			c := &Config{}
			field := leavesOf(c)[p]
			field.Set(nonZero(f.Type()))
			s, l := c.Static(), c.Live()
			found := 0
			for q, v := range leavesOf(&s) {
				found += checkCarried(t, "Static", p, q, v, field)
			}
			for q, v := range leavesOf(&l) {
				found += checkCarried(t, "Live", p, q, v, field)
			}
			if found != 1 {
				t.Errorf("%s set: found in %d places of Static and Live, want 1", p, found)
			}
			plan := Diff(&Config{}, c)
			_, static := leavesOf(&Static{})[p]
			refused := slices.ContainsFunc(plan.Refused, func(c Change) bool { return c.Field == p })
			if refused != static {
				t.Errorf("%s changed: refused %v, want %v (Static: %v); plan %+v", p, refused, static, static, plan)
			}
			if !static && len(plan.Live) == 0 {
				t.Errorf("%s changed: no live change in %+v", p, plan)
			}
		})
	}
}

// checkCarried checks the value at path q of a part against the one field p set: equal at p,
// zero anywhere else. It reports 1 when q is p.
func checkCarried(t *testing.T, part, p, q string, v, set reflect.Value) int {
	t.Helper()
	if q != p {
		if !v.IsZero() {
			t.Errorf("%s set: %s's %s is %v, want it unset", p, part, q, v)
		}
		return 0
	}
	if !reflect.DeepEqual(v.Interface(), set.Interface()) {
		t.Errorf("%s's %s is %v, the config's %v", part, p, v, set)
	}
	return 1
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
