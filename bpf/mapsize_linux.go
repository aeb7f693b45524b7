//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// sizeServiceMaps sets the sizes of the service and backend maps in spec before they are
// created: opts' sizes (the compiled ones when 0), or the size of a map already pinned under
// PinDir, which is adopted as it is.
func sizeServiceMaps(spec *ebpf.CollectionSpec, opts Options, log *slog.Logger) error {
	for _, m := range []struct {
		name, field string
		want        int
	}{
		{"cm_lb_svc", "ServiceMapEntries", opts.ServiceMapEntries},
		{"cm_lb_backend", "BackendMapEntries", opts.BackendMapEntries},
	} {
		ms, ok := spec.Maps[m.name]
		if !ok {
			return fmt.Errorf("map %s is not in the load balancer's objects", m.name)
		}
		if m.want == 0 {
			m.want = int(ms.MaxEntries)
		}
		if err := ValidMapEntries(m.want); err != nil {
			return fmt.Errorf("%s: %w", m.field, err)
		}
		pinned, err := pinnedMaxEntries(filepath.Join(opts.PinDir, m.name))
		if err != nil {
			return err
		}
		if pinned != 0 && pinned != m.want {
			log.Warn("pinned load balancer map keeps its size; the configured size takes effect once the pins are removed",
				"map", m.name, "entries", pinned, "configured", m.want)
			m.want = pinned
		}
		ms.MaxEntries = uint32(m.want)
	}
	return nil
}

// pinnedMaxEntries is the size of the map pinned at path; 0 when none is pinned there.
func pinnedMaxEntries(path string) (int, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read pinned map %s: %w", path, err)
	}
	defer m.Close()
	return int(m.MaxEntries()), nil
}
