package bpflb

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cablemesh/cablemesh/bpf"
)

// Maps sized at Open: SyncFit takes what fits in them and refuses the rest group by group; the
// socket destroy iterators load against the resized maps; a later Open asking another size
// adopts the pinned maps with their size and content.
func TestMapsSizedAtOpenFitWhatTheyHoldAndKeepTheirSizeWhenPinned(t *testing.T) {
	requireRoot(t)
	name := ownPrefix + strconv.Itoa(os.Getpid()) + "-size"
	cg := newCgroup(t, name)
	pin := filepath.Join(bpffsRoot, name)
	t.Cleanup(func() {
		if err := bpf.Purge(pin); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	ctx := context.Background()
	opts := bpf.Options{PinDir: pin, CgroupPath: cg, ServiceMapEntries: 64, BackendMapEntries: 32}
	lb, err := bpf.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if svc, be := lb.Capacity(); svc != 64 || be != 32 {
		t.Fatalf("capacity %d/%d, want 64/32", svc, be)
	}
	group := func(g int) []bpf.Service {
		s := bpf.Service{VIP: netip.MustParseAddr(fmt.Sprintf("241.0.0.%d", g+1)), Port: 80, Proto: bpf.TCP}
		for i := range 20 {
			s.Backends = append(s.Backends, bpf.Backend{Addr: netip.MustParseAddr(fmt.Sprintf("10.9.%d.%d", g, i+1)), Port: 80, ClusterID: 1})
		}
		return []bpf.Service{s}
	}
	// 20 backends each: the backend map (32) takes one group.
	refused, err := lb.SyncFit([][]bpf.Service{group(0), group(1), group(2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != 2 || refused[0].Group != 1 || refused[1].Group != 2 {
		t.Fatalf("refused %+v, want groups 1 and 2", refused)
	}
	held, err := lb.Services()
	if err != nil || len(held) != 1 || held[0].VIP != netip.MustParseAddr("241.0.0.1") || len(held[0].Backends) != 20 {
		t.Fatalf("maps hold %v (%v), want group 0 alone", held, err)
	}
	if _, err := lb.DestroySockets(ctx, []bpf.Endpoint{{Addr: netip.MustParseAddr("10.9.9.9"), Port: 80, Proto: bpf.TCP}}); err != nil && !errors.Is(err, bpf.ErrDestroyUnsupported) {
		t.Fatalf("destroy sockets with resized maps: %v", err)
	}
	if err := lb.Close(); err != nil {
		t.Fatal(err)
	}

	opts.ServiceMapEntries, opts.BackendMapEntries = 128, 128
	lb, err = bpf.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	if svc, be := lb.Capacity(); svc != 64 || be != 32 {
		t.Errorf("reopened with other sizes: capacity %d/%d, want the pinned 64/32", svc, be)
	}
	if again, err := lb.Services(); err != nil || len(again) != 1 {
		t.Errorf("reopened maps hold %v (%v), want what they held", again, err)
	}
}
