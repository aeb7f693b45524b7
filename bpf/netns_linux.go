//go:build linux

package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Socket iterators and sock_diag both see the sockets of one network namespace: the one of
// the thread that creates the iterator or the netlink socket. The sockets to destroy belong to
// the client processes below the hooks' cgroup, which live in their own namespaces (pods), so
// DestroySockets visits each of those namespaces in turn.

type nsID struct{ dev, ino uint64 }

// cgroupNetns opens the network namespace of every process below the cgroup at path (its own
// and its descendants' cgroup.procs), once per namespace. The caller closes the files. A
// process that exits meanwhile is skipped.
func cgroupNetns(path string) ([]*os.File, error) {
	seen := map[nsID]bool{}
	var out []*os.File
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != path {
				return nil // a child cgroup removed while walking
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		pids, err := readProcs(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, pid := range pids {
			f, err := os.Open("/proc/" + pid + "/ns/net")
			if err != nil {
				continue // exited, or a kernel thread
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &st); err != nil {
				f.Close()
				continue
			}
			id := nsID{dev: st.Dev, ino: st.Ino}
			if seen[id] {
				f.Close()
				continue
			}
			seen[id] = true
			out = append(out, f)
		}
		return nil
	})
	if err != nil {
		closeAll(out)
		return nil, fmt.Errorf("list the network namespaces of cgroup %s: %w", path, err)
	}
	return out, nil
}

func readProcs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pids []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if pid := strings.TrimSpace(sc.Text()); pid != "" {
			pids = append(pids, pid)
		}
	}
	return pids, sc.Err()
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// inNetns runs fn on an OS thread that has entered the network namespace ns, and returns the
// thread to this process's namespace afterwards. If it cannot return, the thread is left
// locked so that the runtime ends it with the goroutine instead of reusing it elsewhere.
func inNetns(ns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	go func() { // owned by inNetns, which waits for it
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", ns.Name(), err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return from network namespace %s: %w", ns.Name(), err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
