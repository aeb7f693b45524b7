package statefile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteAtomic(t *testing.T) {
	tests := []struct {
		name string
		old  []byte // nil: no file before
		perm os.FileMode
	}{
		{"a new file is written with the requested mode", nil, 0o600},
		{"an existing file is replaced whole", []byte("a much longer old content that must not survive\n"), 0o600},
		{"a mode the umask would narrow is set as asked", nil, 0o664},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.json")
			if tt.old != nil {
				if err := os.WriteFile(path, tt.old, 0o666); err != nil {
					t.Fatal(err)
				}
			}
			want := []byte("new\n")
			if err := WriteAtomic(path, want, tt.perm); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("content %q (%v), want %q", got, err, want)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tt.perm {
				t.Errorf("mode %v, want %v", fi.Mode().Perm(), tt.perm)
			}
			entries, err := os.ReadDir(dir)
			if err != nil || len(entries) != 1 {
				t.Errorf("directory holds %v (%v), want only the file: a temp file was left behind", entries, err)
			}
		})
	}
}

func TestWriteAtomicIntoAMissingDirectoryFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "state.json")
	if err := WriteAtomic(path, []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("got %v, want a not-exist error", err)
	}
}

type record struct {
	Node  string `json:"node"`
	Value int    `json:"value"`
}

func checkRecord(cluster string, r record) error {
	if r.Value < 0 {
		return fmt.Errorf("cluster %s: value %d is negative", cluster, r.Value)
	}
	return nil
}

func testStore(dir string) Store[record] {
	return Store[record]{Driver: "test", Dir: dir, Check: checkRecord}
}

func TestStoreRoundTrip(t *testing.T) {
	s := testStore(filepath.Join(t.TempDir(), "test"))
	empty, err := s.Load()
	if err != nil || empty == nil || len(empty) != 0 {
		t.Fatalf("missing file: %v %v, want an empty map", empty, err)
	}
	in := map[string]record{"b": {Node: "gw", Value: 3}, "c": {Node: "gw2"}}
	if err := s.Save(in); err != nil {
		t.Fatal(err)
	}
	out, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) || out["b"] != in["b"] || out["c"] != in["c"] {
		t.Errorf("round trip: %+v != %+v", out, in)
	}
	for path, want := range map[string]os.FileMode{s.Dir: 0o700, s.Path(): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	data, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), "{\n  \"version\": 1,") || !strings.HasSuffix(string(data), "}\n") {
		t.Errorf("file is not the indented version-1 document ending in a newline:\n%s", data)
	}
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("file after Remove: %v", err)
	}
	if err := s.Remove(); err != nil {
		t.Errorf("Remove of a missing file: %v, want nil", err)
	}
}

func TestStoreLoadNamesTheDriverAndFile(t *testing.T) {
	s := testStore(t.TempDir())
	if err := os.WriteFile(s.Path(), []byte(`{"version":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := s.Load()
	if err == nil || !strings.Contains(err.Error(), "test connections "+s.Path()+": version 2, want 1") {
		t.Errorf("got %v, want the driver, the path and the reason", err)
	}
}

func TestStoreDecode(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		wantErr string // "" means accepted
		wantLen int
	}{
		{"a version-1 file with records is accepted", `{"version":1,"connections":{"b":{"node":"gw","value":1}}}`, "", 1},
		{"a version-1 file without connections is an empty map", `{"version":1}`, "", 0},
		{"another version is refused", `{"version":2,"connections":{}}`, "version 2, want 1", 0},
		{"a missing version is refused", `{"connections":{}}`, "version 0, want 1", 0},
		{"an empty cluster name is refused", `{"version":1,"connections":{"":{}}}`, "empty cluster name", 0},
		{"a record the driver's check refuses is refused", `{"version":1,"connections":{"b":{"value":-1}}}`, "cluster b: value -1 is negative", 0},
		{"bad JSON is refused", `{"version":1,`, "unexpected end", 0},
		{"trailing data is refused", `{"version":1} {}`, "invalid character", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conns, err := testStore("").Decode([]byte(tt.data))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || conns == nil || len(conns) != tt.wantLen {
				t.Fatalf("got %v (%v), want %d records", conns, err, tt.wantLen)
			}
		})
	}
}

func TestStoreWithoutCheckAcceptsEveryRecord(t *testing.T) {
	s := Store[record]{Driver: "test"}
	conns, err := s.Decode([]byte(`{"version":1,"connections":{"b":{"value":-1}}}`))
	if err != nil || conns["b"].Value != -1 {
		t.Errorf("got %v %v, want the record as stored", conns, err)
	}
}

func FuzzDecodeStore(f *testing.F) {
	f.Add([]byte(`{"version":1,"connections":{"b":{"node":"gw","value":1}}}`))
	f.Add([]byte(`{"version":1,"connections":{"":{"value":1}}}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		conns, err := testStore("").Decode(data)
		if err != nil {
			return
		}
		if conns == nil {
			t.Fatal("accepted a file and returned a nil map")
		}
		for cluster, r := range conns {
			if cluster == "" {
				t.Fatal("accepted an empty cluster")
			}
			if checkRecord(cluster, r) != nil {
				t.Fatalf("accepted a record its check refuses: %+v", r)
			}
		}
	})
}
