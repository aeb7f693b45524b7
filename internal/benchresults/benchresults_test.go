package benchresults

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWriteNamesBothFilesByKindAndUTCTime(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 23, 23, 34, 22, 0, time.FixedZone("CET", 3600))
	base, err := write("", dir, "ingress", now, map[string]float64{"ratio": 1.04}, "# table\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "ingress-2026-11-23T223422Z"); base != want {
		t.Fatalf("base %q, want %q (UTC)", base, want)
	}
	var got map[string]float64
	js, err := os.ReadFile(base + ".json")
	if err != nil || json.Unmarshal(js, &got) != nil || got["ratio"] != 1.04 {
		t.Errorf("json %q, %v", js, err)
	}
	if md, err := os.ReadFile(base + ".md"); err != nil || string(md) != "# table\n" {
		t.Errorf("md %q, %v", md, err)
	}
	other := t.TempDir()
	if base, err := write(other, dir, "dns", now, 1, ""); err != nil || filepath.Dir(base) != other {
		t.Errorf("the environment's directory wins over the default: %q, %v", base, err)
	}
}

func TestWriteReportsWhatCannotBeWritten(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := write("", file, "x", time.Now(), 1, ""); err == nil {
		t.Error("a results directory that is a file: no error")
	}
	if _, err := write("", t.TempDir(), "x", time.Now(), func() {}, ""); err == nil {
		t.Error("results JSON cannot encode: no error")
	}
}
