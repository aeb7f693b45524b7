package store_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/storetest"
)

func openBolt(t *testing.T, path string, opts store.Options) *store.Bolt {
	t.Helper()
	s, err := store.OpenBolt(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestBoltConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts store.Options) (store.Store, func() store.Store) {
		path := filepath.Join(t.TempDir(), "b.db")
		s := openBolt(t, path, opts)
		return s, func() store.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return openBolt(t, path, opts)
		}
	})
}

func TestASecondOpenOfTheSameFileFailsClearly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.db")
	openBolt(t, path, store.Options{})
	_, err := store.OpenBolt(path, store.Options{})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v, want a 'locked by another process' error", err)
	}
}
