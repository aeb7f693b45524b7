package xds

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Who may use the xDS server. It hands out the ingress's private key, so a client is admitted
// by the kernel's word on who it is (SO_PEERCRED on the unix socket, read at accept), not by
// anything it says: root, the agent's own user, Access.UID and processes whose effective gid
// is Access.GID. The socket file's owner and mode keep everyone else from connecting at all;
// the peer check holds even if the file's permissions are loosened afterwards.

// Access are the clients, besides root and the agent's user, allowed on the xDS socket
// (ingress.xds.allowUID and allowGID; 0: none).
type Access struct {
	UID, GID uint32
}

// allows says whether a peer of uid and gid may use the server.
func (a Access) allows(uid, gid uint32) bool {
	switch {
	case uid == 0, uid == uint32(os.Geteuid()):
		return true
	case a.UID != 0 && uid == a.UID:
		return true
	case a.GID != 0 && gid == a.GID:
		return true
	}
	return false
}

// fileOwner is the socket file's owner, group (-1: unchanged) and mode: 0600, the allowed uid's
// with AllowUID, 0660 and the allowed group's with AllowGID.
func (a Access) fileOwner() (uid, gid int, mode os.FileMode) {
	uid, gid, mode = -1, -1, 0o600
	if a.UID != 0 {
		uid = int(a.UID)
	}
	if a.GID != 0 {
		gid, mode = int(a.GID), 0o660
	}
	return uid, gid, mode
}

// listenUnixAs listens on path with the socket file owned and moded as acc says: it is bound
// under a temporary name in the same directory, chowned and chmodded, then renamed to path.
func listenUnixAs(path string, acc Access) (*net.UnixListener, error) {
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, err
	}
	tmp := filepath.Join(filepath.Dir(path), ".xds-"+hex.EncodeToString(suffix[:])+".tmp")
	if len(tmp) > 107 {
		tmp = path // no room for a temporary name: bind in place (the peer check still holds)
	}
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// The listener must not unlink its temporary name on Close: after the rename the file is
	// path, which Server.Close removes.
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		ul.Close()
		os.Remove(tmp)
		return nil, err
	}
	uid, gid, mode := acc.fileOwner()
	if uid != -1 || gid != -1 {
		if err := os.Lchown(tmp, uid, gid); err != nil {
			return fail(fmt.Errorf("give the socket to uid %d gid %d: %w", uid, gid, err))
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(err)
	}
	if tmp != path {
		if err := os.Rename(tmp, path); err != nil {
			return fail(err)
		}
	}
	return ul, nil
}

// peerListener accepts only the connections of peers Access allows; the others are closed at
// once, counted and logged (at most every refusalLogEvery, so a local user cannot flood the log).
type peerListener struct {
	*net.UnixListener
	acc Access
	log *slog.Logger

	mu       sync.Mutex
	count    uint64
	last     string
	loggedAt time.Time
}

const refusalLogEvery = 10 * time.Second

func newPeerListener(ul *net.UnixListener, acc Access, log *slog.Logger) *peerListener {
	return &peerListener{UnixListener: ul, acc: acc, log: log}
}

// Accept returns the next connection of an allowed peer.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		if err == nil && l.acc.allows(cred.Uid, cred.Gid) {
			return c, nil
		}
		c.Close()
		l.refuse(cred, err)
	}
}

// refuse records a refused connection.
func (l *peerListener) refuse(cred *unix.Ucred, err error) {
	what := "a peer whose credentials cannot be read: " + fmt.Sprint(err)
	if err == nil {
		what = fmt.Sprintf("uid %d gid %d pid %d", cred.Uid, cred.Gid, cred.Pid)
	}
	now := time.Now()
	l.mu.Lock()
	l.count++
	l.last = what + " at " + now.UTC().Format(time.RFC3339)
	n := l.count
	logIt := now.Sub(l.loggedAt) >= refusalLogEvery
	if logIt {
		l.loggedAt = now
	}
	l.mu.Unlock()
	if logIt {
		l.log.Warn("xDS connection refused: only root, the agent's user and ingress.xds.allowUID/allowGID may use the xDS server", "peer", what, "refusedSoFar", n)
	}
}

func (l *peerListener) refused() (uint64, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count, l.last
}

// peerCred reads the connecting process's credentials (as of its connect) from the kernel.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, credErr
	}
	if cred == nil {
		return nil, errors.New("no peer credentials")
	}
	return cred, nil
}
