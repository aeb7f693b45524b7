package vxlan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// connectionsFile maps remote clusters to what Connect installed for them. Kernel VXLAN links,
// FDB entries and routes survive an agent restart, but the kernel knows no cluster names: this
// file lets Init tell our entries from stale ones and lets Connections name each connection.
const connectionsFile = "connections.json"

const storeVersion = 1

type storeDoc struct {
	Version     int             `json:"version"`
	Connections map[string]conn `json:"connections"`
}

// loadStore reads the cluster->conn map; a missing file is an empty map.
func loadStore(dir string) (map[string]conn, error) {
	path := filepath.Join(dir, connectionsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]conn{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	doc, err := decodeStore(data)
	if err != nil {
		return nil, fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	return doc.Connections, nil
}

// decodeStore parses the connections file strictly: everything Init and Connections rely on is
// checked, so a damaged file is an error instead of a wrong deletion.
func decodeStore(data []byte) (storeDoc, error) {
	var doc storeDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return storeDoc{}, err
	}
	if doc.Version != storeVersion {
		return storeDoc{}, fmt.Errorf("version %d, want %d", doc.Version, storeVersion)
	}
	if doc.Connections == nil {
		doc.Connections = map[string]conn{}
	}
	for cluster, c := range doc.Connections {
		switch {
		case cluster == "":
			return storeDoc{}, fmt.Errorf("connection with an empty cluster name")
		case c.Device == "" || len(c.Device) > 15:
			return storeDoc{}, fmt.Errorf("cluster %s: device %q is not a link name", cluster, c.Device)
		case c.VNI < 1 || c.VNI > MaxVNI:
			return storeDoc{}, fmt.Errorf("cluster %s: vni %d out of range", cluster, c.VNI)
		case c.Port < 1 || c.Port > 65535 || c.DstPort < 1 || c.DstPort > 65535:
			return storeDoc{}, fmt.Errorf("cluster %s: port %d / dstPort %d out of range", cluster, c.Port, c.DstPort)
		case c.MTU < MinMTU || c.MTU > MaxMTU:
			return storeDoc{}, fmt.Errorf("cluster %s: mtu %d out of range", cluster, c.MTU)
		}
		if _, err := VTEPAddr(c.Address); err != nil {
			return storeDoc{}, fmt.Errorf("cluster %s: %w", cluster, err)
		}
		for _, p := range c.Subnets {
			if !p.IsValid() || !p.Addr().Is4() {
				return storeDoc{}, fmt.Errorf("cluster %s: subnet %s is not an IPv4 CIDR", cluster, p)
			}
		}
	}
	return doc, nil
}

func saveStore(dir string, conns map[string]conn) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("vxlan state directory %s: %w", dir, err)
	}
	data, err := json.MarshalIndent(storeDoc{Version: storeVersion, Connections: conns}, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, connectionsFile)
	tmp, err := os.CreateTemp(dir, connectionsFile+".tmp*")
	if err != nil {
		return fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("vxlan connections %s: %w", path, err)
	}
	return nil
}
