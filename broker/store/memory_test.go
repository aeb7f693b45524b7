package store_test

import (
	"testing"

	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts store.Options) (store.Store, func() store.Store) {
		s := store.NewMemory(opts)
		t.Cleanup(func() { s.Close() })
		return s, nil
	})
}
