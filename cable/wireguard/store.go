package wireguard

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
)

// connectionsFile maps remote clusters to the peers this driver configured for them. A kernel
// device survives an agent restart, and the device itself only knows public keys: this file lets
// Init tell our peers from stale ones and lets Connections name each peer's cluster.
const connectionsFile = "connections.json"

const storeVersion = 1

// storedConn is what Connect configured for one remote cluster.
type storedConn struct {
	Node      string         `json:"node"`
	PublicKey string         `json:"publicKey"`
	Endpoint  string         `json:"endpoint"`
	Subnets   []netip.Prefix `json:"subnets"`
}

type storeDoc struct {
	Version     int                   `json:"version"`
	Connections map[string]storedConn `json:"connections"`
}

// loadStore reads the cluster->peer map; a missing file is an empty map.
func loadStore(dir string) (map[string]storedConn, error) {
	path := filepath.Join(dir, connectionsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]storedConn{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wireguard connections %s: %w", path, err)
	}
	doc, err := decodeStore(data)
	if err != nil {
		return nil, fmt.Errorf("wireguard connections %s: %w", path, err)
	}
	return doc.Connections, nil
}

// decodeStore parses the connections file strictly.
func decodeStore(data []byte) (storeDoc, error) {
	var doc storeDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return storeDoc{}, err
	}
	if doc.Version != storeVersion {
		return storeDoc{}, fmt.Errorf("version %d, want %d", doc.Version, storeVersion)
	}
	if doc.Connections == nil {
		doc.Connections = map[string]storedConn{}
	}
	for cluster, c := range doc.Connections {
		if cluster == "" {
			return storeDoc{}, fmt.Errorf("connection with an empty cluster name")
		}
		for _, p := range c.Subnets {
			if !p.IsValid() {
				return storeDoc{}, fmt.Errorf("cluster %s: invalid subnet", cluster)
			}
		}
	}
	return doc, nil
}

func saveStore(dir string, conns map[string]storedConn) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("wireguard state directory %s: %w", dir, err)
	}
	data, err := json.MarshalIndent(storeDoc{Version: storeVersion, Connections: conns}, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, connectionsFile)
	if err := writeFileAtomic(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("wireguard connections %s: %w", path, err)
	}
	return nil
}
