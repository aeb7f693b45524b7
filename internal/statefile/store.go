package statefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ConnectionsFile is the name of a driver's cluster->connection map inside its state directory.
const ConnectionsFile = "connections.json"

// storeVersion is the version of the connections file; a file of another version is an error
// rather than a guess.
const storeVersion = 1

// Store is one driver's connections file: Dir/connections.json holding
// {"version":1,"connections":{cluster: record}}. T is the driver's own record type, encoded with
// encoding/json. The zero Store is not usable: Driver and Dir are required.
type Store[T any] struct {
	// Driver names the file in errors ("<Driver> connections <path>: ...").
	Driver string
	// Dir is the driver's state directory, StateDir/<driver>; Save creates it 0700.
	Dir string
	// Check validates one loaded record, so that a damaged file is an error instead of a wrong
	// deletion of kernel state. Its error should name the cluster. Nil accepts every record.
	Check func(cluster string, record T) error
}

type storeDoc[T any] struct {
	Version     int          `json:"version"`
	Connections map[string]T `json:"connections"`
}

// Path is the connections file's path.
func (s Store[T]) Path() string { return filepath.Join(s.Dir, ConnectionsFile) }

// Load reads the cluster->record map; a missing file is an empty map.
func (s Store[T]) Load() (map[string]T, error) {
	path := s.Path()
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]T{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s connections %s: %w", s.Driver, path, err)
	}
	conns, err := s.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s connections %s: %w", s.Driver, path, err)
	}
	return conns, nil
}

// Decode parses a connections file strictly: the version must be ours, no cluster name may be
// empty and every record must pass Check. The map is never nil on success.
func (s Store[T]) Decode(data []byte) (map[string]T, error) {
	var doc storeDoc[T]
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc.Version != storeVersion {
		return nil, fmt.Errorf("version %d, want %d", doc.Version, storeVersion)
	}
	if doc.Connections == nil {
		doc.Connections = map[string]T{}
	}
	for cluster, record := range doc.Connections {
		if cluster == "" {
			return nil, fmt.Errorf("connection with an empty cluster name")
		}
		if s.Check != nil {
			if err := s.Check(cluster, record); err != nil {
				return nil, err
			}
		}
	}
	return doc.Connections, nil
}

// Save replaces the file with conns atomically (WriteAtomic, mode 0600), creating Dir (0700)
// when absent.
func (s Store[T]) Save(conns map[string]T) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("%s state directory %s: %w", s.Driver, s.Dir, err)
	}
	data, err := json.MarshalIndent(storeDoc[T]{Version: storeVersion, Connections: conns}, "", "  ")
	if err != nil {
		return err
	}
	path := s.Path()
	if err := WriteAtomic(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("%s connections %s: %w", s.Driver, path, err)
	}
	return nil
}

// Remove deletes the file; a missing file is not an error. The error is the os one, which names
// the path.
func (s Store[T]) Remove() error {
	if err := os.Remove(s.Path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
