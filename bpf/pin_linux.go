//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Pins: maps are pinned by name in PinDir, links in PinDir/links, so that an agent restart
// adopts them instead of detaching anything (an open connection keeps its translation, and
// new connects are translated throughout).

const linkSubdir = "links"

// preparePinDir checks that dir is on bpffs and creates it (and its links directory).
func preparePinDir(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return fmt.Errorf("PinDir %q: want an absolute path on a bpf filesystem", dir)
	}
	// The nearest existing directory decides the filesystem the new ones would be made on.
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if errors.Is(err, unix.ENOENT) && p != "/" {
			continue
		}
		if err != nil {
			return fmt.Errorf("PinDir %s: statfs %s: %w", dir, p, err)
		}
		if st.Type != unix.BPF_FS_MAGIC {
			return fmt.Errorf("PinDir %s: %s is not on a bpf filesystem (mount one first: mount -t bpf bpf /sys/fs/bpf)", dir, p)
		}
		break
	}
	if err := os.MkdirAll(filepath.Join(dir, linkSubdir), 0o700); err != nil {
		return fmt.Errorf("PinDir %s: %w", dir, err)
	}
	return nil
}

func linkPin(dir, name string) string { return filepath.Join(dir, linkSubdir, name) }

// cgroupID is the id the kernel reports for a cgroup2 directory in link info: its inode.
func cgroupID(path string) (uint64, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return 0, fmt.Errorf("CgroupPath %s: %w", path, err)
	}
	if sfs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("CgroupPath %s: not a cgroup2 directory (cgroup2 is mounted at /sys/fs/cgroup/unified on a hybrid layout)", path)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("CgroupPath %s: %w", path, err)
	}
	return st.Ino, nil
}

// sameProgram says whether the program a link runs is prog: the same instructions (the
// kernel's tag hashes them without map fds, so the same object loaded again has the same tag)
// over the same pinned maps (a program of an earlier agent whose map pins were removed since
// still uses its old, unpinned maps).
func sameProgram(l link.Link, prog *ebpf.Program) (bool, error) {
	info, err := l.Info()
	if err != nil {
		return false, err
	}
	old, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return false, fmt.Errorf("program %d: %w", info.Program, err)
	}
	defer old.Close()
	oi, err := old.Info()
	if err != nil {
		return false, err
	}
	ni, err := prog.Info()
	if err != nil {
		return false, err
	}
	if oi.Type != ni.Type || oi.Tag != ni.Tag {
		return false, nil
	}
	oldMaps, ok1 := oi.MapIDs()
	newMaps, ok2 := ni.MapIDs()
	if !ok1 || !ok2 {
		return false, nil // cannot tell: updating is always safe
	}
	for _, id := range newMaps {
		if !slices.Contains(oldMaps, id) && isPinnedMap(id) {
			return false, nil
		}
	}
	return true, nil
}

// isPinnedMap says whether map id is one of the maps pinned by name (cm_*), as opposed to a
// per-load one such as .rodata, which every load of a program has its own of.
func isPinnedMap(id ebpf.MapID) bool {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return true
	}
	defer m.Close()
	info, err := m.Info()
	return err != nil || strings.HasPrefix(info.Name, "cm_")
}

// adopt loads the link pinned at pin, if any, and makes it run prog (link.Update, which
// swaps the program atomically: the hook is never detached). ok is false when nothing is
// pinned there, or when the pinned link is defunct (its target went away) and was unpinned.
// belongs says whether the link's target is the wanted one; a live link attached elsewhere is
// an error, not something to steal.
func adopt(log *slog.Logger, pin string, prog *ebpf.Program, belongs func(*link.Info) (ok, defunct bool)) (link.Link, bool, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("link %s: load pin: %w", pin, err)
	}
	info, err := l.Info()
	if err != nil {
		l.Close()
		return nil, false, fmt.Errorf("link %s: info: %w", pin, err)
	}
	ok, defunct := belongs(info)
	if defunct {
		log.Info("replacing defunct pinned link", "pin", pin, "link", info.ID)
		_ = l.Unpin()
		l.Close()
		return nil, false, nil
	}
	if !ok {
		l.Close()
		return nil, false, fmt.Errorf("link %s (id %d) is attached elsewhere than this configuration asks: remove the old pins first (bpf.Purge)", pin, info.ID)
	}
	same, err := sameProgram(l, prog)
	if err != nil {
		l.Close()
		return nil, false, fmt.Errorf("link %s: compare programs: %w", pin, err)
	}
	if same {
		log.Debug("adopted pinned link", "pin", pin, "link", info.ID)
		return l, true, nil
	}
	if err := l.Update(prog); err != nil {
		l.Close()
		return nil, false, fmt.Errorf("link %s: update program: %w", pin, err)
	}
	log.Info("adopted pinned link with a new program", "pin", pin, "link", info.ID)
	return l, true, nil
}

// pin pins a new link, closing it on failure: an unpinned link would detach at Close.
func pinLink(l link.Link, pin string) error {
	if err := l.Pin(pin); err != nil {
		l.Close()
		return fmt.Errorf("link %s: pin: %w", pin, err)
	}
	return nil
}

// detachPinned detaches the link pinned at pin and removes the pin.
func detachPinned(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not a link (a stray file): removing the pin is all that can be done.
		if rmErr := os.Remove(pin); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			return fmt.Errorf("link %s: %w", pin, rmErr)
		}
		return nil
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, unix.ENOLINK) {
		return fmt.Errorf("link %s: detach: %w", pin, err)
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("link %s: unpin: %w", pin, err)
	}
	return nil
}

// removePins detaches the pinned links and unpins the maps of dir whose names start with one
// of prefixes, then removes dir if nothing else is left in it.
func removePins(dir string, mapPrefix, linkPrefix string) error {
	var errs []error
	links, _ := os.ReadDir(filepath.Join(dir, linkSubdir))
	for _, e := range links {
		if strings.HasPrefix(e.Name(), linkPrefix) {
			errs = append(errs, detachPinned(linkPin(dir, e.Name())))
		}
	}
	maps, _ := os.ReadDir(dir)
	for _, e := range maps {
		if !e.IsDir() && strings.HasPrefix(e.Name(), mapPrefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("unpin map %s: %w", e.Name(), err))
			}
		}
	}
	// Remove fails on a directory that still holds something: that is what is wanted.
	_ = os.Remove(filepath.Join(dir, linkSubdir))
	_ = os.Remove(dir)
	return errors.Join(errs...)
}

// Purge detaches every link pinned under pinDir and deletes pinDir with its map pins: the
// cleanup of an agent that exits for good, or of a test, without opening anything. A missing
// pinDir is no error.
func Purge(pinDir string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(pinDir, &st); err != nil {
		return fmt.Errorf("purge %s: %w", pinDir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("purge %s: not on a bpf filesystem, refusing to delete it", pinDir)
	}
	if err := removePins(pinDir, "", ""); err != nil {
		return fmt.Errorf("purge %s: %w", pinDir, err)
	}
	if err := os.RemoveAll(pinDir); err != nil {
		return fmt.Errorf("purge %s: %w", pinDir, err)
	}
	return nil
}
