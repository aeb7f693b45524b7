package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// exportsOf is n exports of east/gw1 named <prefix>-<i>, of endpoints endpoints each.
func exportsOf(prefix string, n, endpoints int) []*apiv1.ServiceExport {
	out := make([]*apiv1.ServiceExport, n)
	for i := range out {
		e := &apiv1.ServiceExport{Cluster: "east", Node: "gw1", Namespace: "shop", Name: fmt.Sprintf("%s-%d", prefix, i)}
		for j := range endpoints {
			e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.1.%d.%d", j>>8, j&0xff), Ready: true})
		}
		out[i] = e
	}
	return out
}

func putAll(t *testing.T, s Store, exports []*apiv1.ServiceExport) Commit {
	t.Helper()
	c, err := s.Update(context.Background(), func(tx Tx) error {
		for _, e := range exports {
			if err := tx.PutServiceExport(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func deleteAll(t *testing.T, s Store, exports []*apiv1.ServiceExport) {
	t.Helper()
	_, err := s.Update(context.Background(), func(tx Tx) error {
		for _, e := range exports {
			if err := tx.DeleteServiceExport(e.Cluster, e.Node, e.Namespace, e.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTheHubKeepsAtMostMaxRecentBytes churns large commits: recent keeps no more than
// maxRecentBytes of them (it kept maxRecent commits whatever their size), and a watcher that
// starts after them still gets the state, then every later revision in order.
func TestTheHubKeepsAtMostMaxRecentBytes(t *testing.T) {
	m := NewMemory(Options{})
	defer m.Close()
	// One commit is a few hundred KB encoded: 20 of them are well past maxRecentBytes.
	exports := exportsOf("svc", 64, 256)
	for range 10 {
		putAll(t, m, exports)
		deleteAll(t, m, exports)
	}
	m.hub.mu.Lock()
	kept, bytes, sum := len(m.hub.recent), m.hub.recentBytes, 0
	for _, n := range m.hub.recentSizes {
		sum += n
	}
	m.hub.mu.Unlock()
	if bytes > maxRecentBytes || bytes != sum || kept == 0 || kept >= 20 {
		t.Fatalf("recent keeps %d of 20 commits, %d bytes (sizes add up to %d); want fewer, within %d bytes", kept, bytes, sum, maxRecentBytes)
	}
	w, err := m.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); !b.Snapshot || len(b.Events) != 0 {
		t.Fatalf("first batch after the churn: snapshot=%v, %d events; want an empty snapshot", b.Snapshot, len(b.Events))
	}
	c := putAll(t, m, exports[:1])
	if b := <-w.C(); b.Snapshot || b.Revision != c.Revision || len(b.Events) != 1 {
		t.Fatalf("next batch: snapshot=%v, revision %d, %d events; want the delta of revision %d", b.Snapshot, b.Revision, len(b.Events), c.Revision)
	}
}

// TestALogWithoutItsSizeIsCounted: a log written by a broker that did not record its size (or
// written on since it was recorded) is counted before it is trimmed by size.
func TestALogWithoutItsSizeIsCounted(t *testing.T) {
	for _, tt := range []struct {
		name  string
		value []byte // meta/logBytes as an older broker left it
	}{
		{"absent", nil},
		{"recorded at an older revision", logBytesValue(1, 7)},
		{"malformed", []byte{1, 2, 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMemory(Options{})
			defer m.Close()
			for i := range 5 {
				putAll(t, m, exportsOf(fmt.Sprint("s", i), 1, 50))
			}
			d := *m.data.Load()
			if tt.value == nil {
				delete(d[string(bucketMeta)], string(keyLogBytes))
			} else {
				d[string(bucketMeta)][string(keyLogBytes)] = tt.value
			}
			c := putAll(t, m, exportsOf("last", 1, 50))
			d = *m.data.Load()
			want := 0
			for _, v := range d[string(bucketEvents)] {
				want += len(v)
			}
			v := d[string(bucketMeta)][string(keyLogBytes)]
			if len(v) != 16 || binary.BigEndian.Uint64(v) != c.Revision || binary.BigEndian.Uint64(v[8:]) != uint64(want) {
				t.Fatalf("meta/logBytes %x after revision %d; want revision %d and %d bytes", v, c.Revision, c.Revision, want)
			}
		})
	}
}
