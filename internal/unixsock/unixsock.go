// Package unixsock listens on a unix socket at a fixed path, as an agent restarted in place
// needs: a socket file nobody answers on was left by a process that died and is replaced; one
// that answers belongs to a live process, and taking it would cut that process off.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ErrServed is Listen's error for a socket another live process answers on.
var ErrServed = errors.New("another process is serving on it")

// Listen creates path's directory, replaces a stale socket file, listens on path and gives the
// socket file mode. Its errors do not name path: callers say which setting it is.
func Listen(path string, mode os.FileMode) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, errors.New("exists and is not a socket")
		}
		if c, err := net.DialTimeout("unix", path, 300*time.Millisecond); err == nil {
			c.Close()
			return nil, ErrServed
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, mode); err != nil {
		lis.Close()
		return nil, err
	}
	return lis, nil
}
