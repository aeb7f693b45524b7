//go:build linux

package bpf

import "testing"

// The documented defaults are the sizes compiled into the objects.
func TestCompiledMapSizesAreTheDefaults(t *testing.T) {
	spec, err := loadLbSock()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"cm_lb_svc": DefaultServiceMapEntries, "cm_lb_backend": DefaultBackendMapEntries} {
		if got := int(spec.Maps[name].MaxEntries); got != want {
			t.Errorf("%s holds %d entries, the default is documented as %d", name, got, want)
		}
	}
}

func TestValidMapEntries(t *testing.T) {
	for n, ok := range map[int]bool{0: false, MinMapEntries - 1: false, MinMapEntries: true, 65536: true, MaxMapEntries: true, MaxMapEntries + 1: false} {
		if err := ValidMapEntries(n); (err == nil) != ok {
			t.Errorf("ValidMapEntries(%d) = %v, want ok %v", n, err, ok)
		}
	}
}
