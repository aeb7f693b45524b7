package ingressport

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func key(name string, port uint32) Key {
	return Key{Namespace: "shop", Name: name, Port: port, Protocol: "TCP"}
}

func TestAssign(t *testing.T) {
	r := Range{First: 15000, Last: 15003}
	tests := []struct {
		name   string
		prev   map[Key]uint16
		wanted []Key
		want   map[Key]uint16
		err    bool
	}{
		{"new keys take the lowest free ports in key order", nil, []Key{key("web", 80), key("api", 80)},
			map[Key]uint16{key("api", 80): 15000, key("web", 80): 15001}, false},
		{"a key keeps its port whatever else changes", map[Key]uint16{key("web", 80): 15002},
			[]Key{key("api", 80), key("web", 80)}, map[Key]uint16{key("api", 80): 15000, key("web", 80): 15002}, false},
		{"an unexported key releases its port", map[Key]uint16{key("old", 80): 15000, key("web", 80): 15001},
			[]Key{key("web", 80), key("new", 80)}, map[Key]uint16{key("new", 80): 15000, key("web", 80): 15001}, false},
		{"a port outside a narrowed range is moved into it", map[Key]uint16{key("web", 80): 16000},
			[]Key{key("web", 80)}, map[Key]uint16{key("web", 80): 15000}, false},
		{"a key listed twice gets one port", nil, []Key{key("web", 80), key("web", 80)}, map[Key]uint16{key("web", 80): 15000}, false},
		{"an exhausted range serves the keys it can and says which it cannot", nil,
			[]Key{key("a", 1), key("b", 1), key("c", 1), key("d", 1), key("e", 1)},
			map[Key]uint16{key("a", 1): 15000, key("b", 1): 15001, key("c", 1): 15002, key("d", 1): 15003}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Assign(tt.prev, tt.wanted, r)
			if (err != nil) != tt.err || (err != nil && !errors.Is(err, ErrExhausted)) {
				t.Fatalf("error %v, want error %v", err, tt.err)
			}
			if tt.err && !strings.Contains(err.Error(), "shop/e/1/TCP") {
				t.Errorf("error %v does not name the key left out", err)
			}
			if !Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSaveLoadRoundTripAndDamagedFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	empty, err := Load(dir)
	if err != nil || len(empty) != 0 {
		t.Fatalf("missing file: %v %v", empty, err)
	}
	in := map[Key]uint16{key("web", 80): 15000, {Namespace: "shop", Name: "dns", Port: 53, Protocol: "UDP"}: 15001}
	if err := Save(dir, in); err != nil {
		t.Fatal(err)
	}
	out, err := Load(dir)
	if err != nil || !Equal(in, out) {
		t.Fatalf("round trip: %v %v", out, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, File)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode: %v %v", fi, err)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"version":2,"ports":{}}`, "version 2"},
		{`{"version":1,"ports":{"shop/web/80":15000}}`, "is not namespace/name/port/protocol"},
		{`{"version":1,"ports":{"shop/web/0/TCP":15000}}`, `port "0"`},
		{`{"version":1,"ports":{"shop/web/80/TCP":0}}`, "port 0"},
		{`{"version":1,"ports":{"shop/a/80/TCP":15000,"shop/b/80/TCP":15000}}`, "port 15000 is held by both shop/a/80/TCP and shop/b/80/TCP"},
		{`not json`, "invalid character"},
	} {
		if err := os.WriteFile(filepath.Join(dir, File), []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "fix or remove the file") {
			t.Errorf("%s: error %v, want one containing %q", tc.body, err, tc.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"ports":{"shop/web/80/TCP":15000}}`))
	f.Add([]byte(`{"version":1,"ports":{"a/b/1/UDP":1,"a/c/2/TCP":2}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ports, err := Decode(data)
		if err != nil {
			return
		}
		// What decodes encodes back to the same allocation, and no port is held twice.
		again, err := Decode(Encode(ports))
		if err != nil || !Equal(ports, again) {
			t.Fatalf("round trip of %v: %v %v", ports, again, err)
		}
		seen := map[uint16]bool{}
		for _, p := range ports {
			if p == 0 || seen[p] {
				t.Fatalf("port %d zero or held twice in %v", p, ports)
			}
			seen[p] = true
		}
	})
}
