// Package statefile writes state files so that a crash leaves the old or the new content, never
// half of one, and holds the one format the cable drivers keep their cluster->connection map in.
//
// The kernel state a driver installs (links, peers, FDB entries, routes) survives an agent
// restart, but the kernel knows no cluster names: a driver's connections file
// (StateDir/<driver>/connections.json) lets its Init tell its own entries from stale ones and
// lets Connections name each connection's cluster.
package statefile

import (
	"os"
	"path/filepath"
)

// WriteAtomic writes data to path through a temporary file in the same directory (mode perm,
// fsync) and a rename over path, so a crash leaves the old or the new file. The directory must
// exist. Errors are the os ones, unwrapped: the caller knows what the file is and names it.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	// CreateTemp makes 0600 files; Chmod sets perm whatever it is, with no umask in the way.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	// Without the fsync a crash after the rename can leave an empty file under the new name.
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
