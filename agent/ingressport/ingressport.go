// Package ingressport allocates the gateway ingress's ports: every exported service port gets one
// port of the ingress range ("one inbound per service, port picked automatically"),
// stable across agent restarts (kept in stateDir/ingress-ports.json) and published with the
// export (ServicePort.ingress_port). Both ingress data planes (kernel nftables and Envoy over xDS)
// serve the ports this package hands out; Assign is pure, Load and Save touch the file.
package ingressport

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cablemesh/cablemesh/internal/statefile"
)

// File is the allocations' file in the state directory.
const File = "ingress-ports.json"

// fileVersion is the file format's version; another version is an error, not a guess.
const fileVersion = 1

// Key names one exported service port: namespace, name, port and protocol.
type Key struct {
	Namespace string
	Name      string
	Port      uint32
	Protocol  string
}

// String is the key's form in the file: namespace/name/port/PROTOCOL.
func (k Key) String() string {
	return fmt.Sprintf("%s/%s/%d/%s", k.Namespace, k.Name, k.Port, k.Protocol)
}

// ParseKey parses the String form.
func ParseKey(s string) (Key, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" || parts[3] == "" {
		return Key{}, fmt.Errorf("key %q is not namespace/name/port/protocol", s)
	}
	p, err := strconv.ParseUint(parts[2], 10, 16)
	if err != nil || p == 0 {
		return Key{}, fmt.Errorf("key %q: port %q is not 1..65535", s, parts[2])
	}
	return Key{Namespace: parts[0], Name: parts[1], Port: uint32(p), Protocol: parts[3]}, nil
}

// Range is the inclusive range ports are allocated from.
type Range struct{ First, Last uint16 }

// Contains reports whether p lies in the range.
func (r Range) Contains(p uint16) bool { return p >= r.First && p <= r.Last }

// ErrExhausted is returned by Assign when the range holds fewer ports than the keys need.
var ErrExhausted = errors.New("ingress port range exhausted")

// Assign gives every wanted key a port of r: the port it held in prev if that is still in the
// range, else the lowest free one (in key order, so that the result depends on the inputs
// alone). Keys of prev that are not wanted any more are released. Keys that find no free port
// are left out and reported with ErrExhausted (the others keep theirs). It is pure.
func Assign(prev map[Key]uint16, wanted []Key, r Range) (map[Key]uint16, error) {
	out := make(map[Key]uint16, len(wanted))
	used := map[uint16]bool{}
	keys := slices.Clone(wanted)
	slices.SortFunc(keys, compareKeys)
	keys = slices.Compact(keys)
	var fresh []Key
	for _, k := range keys {
		if p, ok := prev[k]; ok && r.Contains(p) && !used[p] {
			out[k], used[p] = p, true
			continue
		}
		fresh = append(fresh, k)
	}
	next := int(r.First)
	var short []string
	for _, k := range fresh {
		for next <= int(r.Last) && used[uint16(next)] {
			next++
		}
		if next > int(r.Last) {
			short = append(short, k.String())
			continue
		}
		out[k], used[uint16(next)] = uint16(next), true
	}
	if len(short) > 0 {
		return out, fmt.Errorf("%w: %d..%d has no port left for %s", ErrExhausted, r.First, r.Last, strings.Join(short, ", "))
	}
	return out, nil
}

func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}

type doc struct {
	Version int               `json:"version"`
	Ports   map[string]uint16 `json:"ports"`
}

// Decode parses the file's content strictly: our version, valid keys, no port 0, no port twice.
func Decode(data []byte) (map[Key]uint16, error) {
	var d doc
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	if d.Version != fileVersion {
		return nil, fmt.Errorf("version %d, want %d", d.Version, fileVersion)
	}
	out := make(map[Key]uint16, len(d.Ports))
	owner := map[uint16]string{}
	for s, p := range d.Ports {
		k, err := ParseKey(s)
		if err != nil {
			return nil, err
		}
		if p == 0 {
			return nil, fmt.Errorf("%s: port 0", s)
		}
		if o, dup := owner[p]; dup {
			return nil, fmt.Errorf("port %d is held by both %s and %s", p, min(o, s), max(o, s))
		}
		owner[p] = s
		out[k] = p
	}
	return out, nil
}

// Encode is the file's content for ports.
func Encode(ports map[Key]uint16) []byte {
	d := doc{Version: fileVersion, Ports: make(map[string]uint16, len(ports))}
	for k, p := range ports {
		d.Ports[k.String()] = p
	}
	data, _ := json.MarshalIndent(d, "", "  ") // maps of strings to ints always marshal
	return append(data, '\n')
}

// Load reads dir/File; a missing file is no allocation. A damaged file is an error: silently
// starting over would move every service to another port.
func Load(dir string) (map[Key]uint16, error) {
	path := filepath.Join(dir, File)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[Key]uint16{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ingress ports: %w", err)
	}
	ports, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("ingress ports %s: %w (fix or remove the file)", path, err)
	}
	return ports, nil
}

// Save writes dir/File atomically (mode 0600), creating dir.
func Save(dir string, ports map[Key]uint16) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("ingress ports: %w", err)
	}
	path := filepath.Join(dir, File)
	if err := statefile.WriteAtomic(path, Encode(ports), 0o600); err != nil {
		return fmt.Errorf("ingress ports: write %s: %w", path, err)
	}
	return nil
}

// Equal reports whether two allocations are the same.
func Equal(a, b map[Key]uint16) bool { return maps.Equal(a, b) }
