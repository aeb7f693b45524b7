package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
)

// The state directory holds the node's identity: agent.key authenticates the node to the
// broker, ca.crt is the mesh CA the agent trusts the broker by. A local user who can write the
// directory can replace ca.crt with a CA of their own, or move agent.key away and put theirs;
// one who can read agent.key is the node. The agent therefore checks, before it uses them:
//
//	what                                     problem                        the agent
//	stateDir, owned by the agent's user       group or others can write it   tightens it to 0700 and logs a warning
//	stateDir, owned by root (agent not root)   group or others can write it   refuses (exit 2): it cannot tighten it
//	stateDir                                  owned by another non-root user refuses: that user can do anything to it
//	a file or directory in stateDir           group or others can write it   refuses: it may already have been
//	                                                                         replaced; check it, then chmod go-w
//	a private key (agent.key, *.key, agent.key.new, and below stateDir/*/)
//	                                          group or others can read it    refuses: the key may have leaked;
//	                                                                         chmod 600, and rotate it
//	any of them                               owned by another non-root user refuses
//
// A file is refused rather than tightened because tightening cannot undo what another user may
// already have done to it; the directory is tightened because, while the files in it are
// sound, closing it is all that is needed (and an agent upgraded over a loose directory keeps
// running). Regular files and directories are checked, one level down too (the drivers'
// directories, e.g. wireguard/); sockets are not (charon's vici socket has its own mode).

// errStateDirMode is why a state directory or file was refused.
var errStateDirMode = errors.New("unsafe permissions")

// fileOwner is the uid owning fi.
func fileOwner(fi fs.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Uid, true
}

// foreignOwner reports whether uid is neither root nor the agent's user.
func foreignOwner(uid uint32, euid int) bool { return uid != 0 && int(uid) != euid }

// isPrivateKeyFile reports whether name (a file in the state directory or one level below) is a
// private key, which nobody but the agent may read.
func isPrivateKeyFile(name string) bool {
	base := filepath.Base(name)
	return base == brokerclient.KeyFile || strings.HasSuffix(base, ".key") ||
		strings.HasPrefix(base, brokerclient.KeyFile+".") || strings.Contains(base, "private")
}

// checkStateDirPermissions refuses a state directory, or a file or directory in it, that another
// local user could have tampered with (see the table above); a directory that only needs
// tightening (ours, group/others-writable) passes: TightenStateDir fixes it. A missing
// directory passes (the agent creates it 0700). euid is the agent's effective uid.
func checkStateDirPermissions(dir string, euid int) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &FileError{Field: "stateDir", Path: dir, Err: err}
	}
	uid, ok := fileOwner(fi)
	if !ok {
		return nil
	}
	if foreignOwner(uid, euid) {
		return &FileError{Field: "stateDir", Path: dir, Err: fmt.Errorf("%w: owned by uid %d, neither root nor the agent's user (uid %d): that user can replace ca.crt or take agent.key; chown it to the agent's user and check its files",
			errStateDirMode, uid, euid)}
	}
	if fi.Mode().Perm()&0o022 != 0 && int(uid) != euid {
		return &FileError{Field: "stateDir", Path: dir, Err: fmt.Errorf("%w: group or others can write it (mode %04o) and it is owned by uid %d, not the agent's user (uid %d), so the agent cannot tighten it: chmod 700 it and check its files",
			errStateDirMode, fi.Mode().Perm(), uid, euid)}
	}
	return checkStateFiles(dir, euid, 1)
}

// checkStateFiles checks the entries of dir, and depth more levels below.
func checkStateFiles(dir string, euid, depth int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return &FileError{Field: "stateDir", Path: dir, Err: err}
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		fi, err := os.Stat(path) // follows a symlink: its target is what the agent reads
		if err != nil {
			continue // a dangling link or a file removed meanwhile: whoever reads it says why
		}
		if err := checkStateEntry(path, fi, euid); err != nil {
			return err
		}
		if fi.IsDir() && depth > 0 {
			if err := checkStateFiles(path, euid, depth-1); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStateEntry checks one file or directory of the state directory.
func checkStateEntry(path string, fi fs.FileInfo, euid int) error {
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		return nil // a socket (charon's vici) or a fifo holds no identity
	}
	mode := fi.Mode().Perm()
	refuse := func(format string, a ...any) error {
		return &FileError{Field: "stateDir", Path: path, Err: fmt.Errorf("%w: "+format, append([]any{errStateDirMode}, a...)...)}
	}
	if uid, ok := fileOwner(fi); ok && foreignOwner(uid, euid) {
		return refuse("owned by uid %d, neither root nor the agent's user (uid %d): that user may have replaced it; check it, chown it to the agent's user", uid, euid)
	}
	if mode&0o022 != 0 {
		return refuse("group or others can write it (mode %04o): another local user may already have replaced it; check its content, then chmod go-w it", mode)
	}
	if fi.Mode().IsRegular() && isPrivateKeyFile(path) && mode&0o044 != 0 {
		return refuse("a private key that group or others can read (mode %04o): it may have leaked; chmod 600 it, and rotate it (re-join the node with a new token) if another user could log in here", mode)
	}
	return nil
}

// TightenStateDir removes group and others' access to the state directory when they can write
// it and it is the agent's own (checkStateDirPermissions refused every other case), and says so.
// It returns the warning logged ("" when nothing was done).
func TightenStateDir(dir string, euid int) (string, error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", &FileError{Field: "stateDir", Path: dir, Err: err}
	}
	uid, ok := fileOwner(fi)
	if !ok || int(uid) != euid || fi.Mode().Perm()&0o022 == 0 {
		return "", nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", &FileError{Field: "stateDir", Path: dir, Err: fmt.Errorf("group or others can write it (mode %04o) and chmod 700 failed: %w", fi.Mode().Perm(), err)}
	}
	return fmt.Sprintf("state directory %s was writable by group or others (mode %04o): tightened to 0700; its files were checked and are not writable by others, but check ca.crt and agent.crt if another user could log in here",
		dir, fi.Mode().Perm()), nil
}
