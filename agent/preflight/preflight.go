// Package preflight checks, before the agent creates anything, the files and directories its
// config names: the state directory (and its permissions, tightened when only too loose) and, on
// first start, the join token file.
package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/api/jointoken"
)

// FileError is a file the config names that the agent cannot use: a stateDir that is no
// directory, or on first start a join token file that is missing, unreadable or no token for
// this cluster. It is a bad config, found before anything is created (cmd/cable-agent exits 2).
type FileError struct {
	Field string // the config field: stateDir, joinTokenFile
	Path  string // the path it names ("" when unset)
	Err   error
}

func (e *FileError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", e.Field, e.Path, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// CheckFiles checks the files the config names before the agent creates anything: stateDir must
// be a directory, or not exist yet below directories; its files must be safe from other local
// users (checkStateDirPermissions); and when it holds no agent certificate (the node has not
// joined), joinTokenFile (the live one, read only before the first join) must be set and hold a
// join token of cfg's cluster. It reads, never writes. Its errors are *FileError.
func CheckFiles(cfg config.Static, joinTokenFile string) error {
	if err := checkStateDir(cfg.StateDir); err != nil {
		return err
	}
	if err := checkStateDirPermissions(cfg.StateDir, os.Geteuid()); err != nil {
		return err
	}
	_, err := os.Stat(filepath.Join(cfg.StateDir, brokerclient.CertFile))
	if !errors.Is(err, fs.ErrNotExist) {
		return nil // joined (or unreadable: loading the identity says why)
	}
	tokenErr := func(err error) error { return &FileError{Field: "joinTokenFile", Path: joinTokenFile, Err: err} }
	if joinTokenFile == "" {
		return tokenErr(fmt.Errorf("is required on first start: stateDir %s holds no agent certificate (%s) yet, so the node must join with a token (cablectl cluster join-token)",
			cfg.StateDir, brokerclient.CertFile))
	}
	raw, err := os.ReadFile(joinTokenFile)
	if err != nil {
		return tokenErr(fmt.Errorf("cannot read the join token the node needs to join (stateDir holds no agent certificate yet): %w", err))
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return tokenErr(errors.New("is empty: put the token printed by cablectl cluster join-token in it"))
	}
	claims, err := jointoken.Decode(token)
	if err != nil {
		return tokenErr(fmt.Errorf("holds no join token: %w", err))
	}
	if claims.Cluster != cfg.Cluster {
		return tokenErr(fmt.Errorf("the token is for cluster %q, the config says cluster %q", claims.Cluster, cfg.Cluster))
	}
	return nil
}

// checkStateDir accepts a directory, or a path that does not exist yet whose first existing
// ancestor is a directory.
func checkStateDir(dir string) error {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		switch {
		case (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) && p != filepath.Dir(p):
			continue
		case err != nil:
			return &FileError{Field: "stateDir", Path: dir, Err: err}
		case !fi.IsDir() && p == filepath.Clean(dir):
			return &FileError{Field: "stateDir", Path: dir, Err: errors.New("exists and is not a directory")}
		case !fi.IsDir():
			return &FileError{Field: "stateDir", Path: dir, Err: fmt.Errorf("%s is not a directory", p)}
		}
		return nil
	}
}

// TokenFileProblem says why the join token file at path is a risk: readable by group or others
// (anyone who can read it can join a node while it is valid). "" when it is not, or is gone.
func TokenFileProblem(path string) string {
	if path == "" {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o044 == 0 {
		return ""
	}
	return fmt.Sprintf("join token file %s is readable by others (mode %04o): whoever reads it can join a node to this cluster while the token is valid; chmod 600 it, and delete it once the node has joined",
		path, fi.Mode().Perm())
}

// Run checks, as the agent starts, the files the config names (CheckFiles), warns about a join
// token file others can read, and tightens a state directory others can write to
// (TightenStateDir).
func Run(cfg config.Static, joinTokenFile string, log *slog.Logger) error {
	if err := CheckFiles(cfg, joinTokenFile); err != nil {
		return err
	}
	if p := TokenFileProblem(joinTokenFile); p != "" {
		log.Warn("JOIN TOKEN FILE IS READABLE BY OTHERS: "+p, "joinTokenFile", joinTokenFile)
	}
	w, err := TightenStateDir(cfg.StateDir, os.Geteuid())
	if err != nil {
		return err
	}
	if w != "" {
		log.Warn("STATE DIRECTORY WAS WRITABLE BY OTHERS: "+w, "stateDir", cfg.StateDir)
	}
	return nil
}
