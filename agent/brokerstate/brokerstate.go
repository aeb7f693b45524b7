// Package brokerstate is the agent's copy of the broker's state (clusters, endpoints, connection
// policies, revision): applying watch messages to it is pure, and it persists atomically to the
// state dir so the agent can start, and keep its tunnels, without the broker.
//
// The cluster records the broker sends an agent carry the pair's pre-shared key (pair_psk), so
// the cache file is written 0600 and its records are never logged.
package brokerstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/statefile"
)

// FileName is the cache file inside the agent's state dir.
const FileName = "broker-state.json"

// State is what the agent knows of the broker. The zero value is an empty state at revision 0.
type State struct {
	Revision  uint64
	Clusters  map[string]*apiv1.Cluster  // by cluster name
	Endpoints map[string]*apiv1.Endpoint // by "cluster/node"
	// Policies are the mesh's connection policies by name, the default one (is_default)
	// included. Empty when the broker predates policies.
	Policies map[string]*apiv1.Policy
	// Imports are the service imports this agent may use, as the broker last sent them (the
	// watch's imports field replaces them whole); HasImports is false until the first set
	// arrived (or was loaded from the cache), so that the agent can tell "no imports" from "not
	// known yet" (its DNS answers SERVFAIL until then).
	Imports    []*apiv1.ServiceImport
	HasImports bool
}

// New returns an empty state.
func New() *State {
	return &State{Clusters: map[string]*apiv1.Cluster{}, Endpoints: map[string]*apiv1.Endpoint{}, Policies: map[string]*apiv1.Policy{}}
}

// EndpointKey is the key the broker uses for an endpoint in events.
func EndpointKey(cluster, node string) string { return cluster + "/" + node }

// Clone returns a deep copy, so readers can use it without holding the writer's lock.
func (s *State) Clone() *State {
	c := New()
	c.Revision = s.Revision
	for k, v := range s.Clusters {
		c.Clusters[k] = proto.Clone(v).(*apiv1.Cluster)
	}
	for k, v := range s.Endpoints {
		c.Endpoints[k] = proto.Clone(v).(*apiv1.Endpoint)
	}
	for k, v := range s.Policies {
		c.Policies[k] = proto.Clone(v).(*apiv1.Policy)
	}
	c.Imports = cloneImports(s.Imports)
	c.HasImports = s.HasImports
	return c
}

func cloneImports(in []*apiv1.ServiceImport) []*apiv1.ServiceImport {
	if in == nil {
		return nil
	}
	out := make([]*apiv1.ServiceImport, len(in))
	for i, imp := range in {
		out[i] = proto.Clone(imp).(*apiv1.ServiceImport)
	}
	return out
}

// Apply applies one watch message: a snapshot replaces every record, deltas upsert or delete one
// record each, and a message with imports replaces the imports whole (a snapshot without them
// keeps the imports held: they travel apart from the events). It returns an error, and leaves s
// unchanged, if the message is malformed.
func (s *State) Apply(resp *apiv1.WatchResponse) error {
	next := s
	if resp.GetSnapshot() {
		next = New()
		next.Imports, next.HasImports = cloneImports(s.Imports), s.HasImports
	} else {
		next = s.Clone()
	}
	if imps := resp.GetImports(); imps != nil {
		for i, imp := range imps.GetImports() {
			if imp.GetNamespace() == "" || imp.GetName() == "" {
				return fmt.Errorf("imports[%d]: no namespace or name", i)
			}
		}
		next.Imports = cloneImports(imps.GetImports())
		if next.Imports == nil {
			next.Imports = []*apiv1.ServiceImport{}
		}
		next.HasImports = true
	}
	for i, ev := range resp.GetEvents() {
		if err := next.applyEvent(ev); err != nil {
			return fmt.Errorf("event %d (%s %s %q): %w", i, ev.GetType(), ev.GetKind(), ev.GetKey(), err)
		}
	}
	if resp.GetRevision() != 0 {
		next.Revision = resp.GetRevision()
	} else if n := len(resp.GetEvents()); n > 0 && resp.GetEvents()[n-1].GetRevision() > next.Revision {
		next.Revision = resp.GetEvents()[n-1].GetRevision()
	}
	*s = *next
	return nil
}

func (s *State) applyEvent(ev *apiv1.Event) error {
	kind := ev.GetKind()
	if kind == "" {
		switch {
		case ev.GetResource().GetCluster() != nil:
			kind = "cluster"
		case ev.GetResource().GetEndpoint() != nil:
			kind = "endpoint"
		case ev.GetResource().GetPolicy() != nil:
			kind = "policy"
		}
	}
	switch kind {
	case "cluster":
		key := ev.GetKey()
		if c := ev.GetResource().GetCluster(); c != nil && key == "" {
			key = c.GetName()
		}
		if ev.GetType() == apiv1.Event_DELETE {
			delete(s.Clusters, key)
			return nil
		}
		c := ev.GetResource().GetCluster()
		if c == nil {
			return errors.New("upsert without a cluster resource")
		}
		if key == "" {
			return errors.New("cluster without a name")
		}
		s.Clusters[key] = proto.Clone(c).(*apiv1.Cluster)
	case "endpoint":
		key := ev.GetKey()
		if e := ev.GetResource().GetEndpoint(); e != nil && key == "" {
			key = EndpointKey(e.GetCluster(), e.GetNode())
		}
		if ev.GetType() == apiv1.Event_DELETE {
			delete(s.Endpoints, key)
			return nil
		}
		e := ev.GetResource().GetEndpoint()
		if e == nil {
			return errors.New("upsert without an endpoint resource")
		}
		if !strings.Contains(key, "/") {
			return fmt.Errorf("endpoint key %q is not cluster/node", key)
		}
		s.Endpoints[key] = proto.Clone(e).(*apiv1.Endpoint)
	case "policy":
		key := ev.GetKey()
		if p := ev.GetResource().GetPolicy(); p != nil && key == "" {
			key = p.GetName()
		}
		if ev.GetType() == apiv1.Event_DELETE {
			delete(s.Policies, key)
			return nil
		}
		p := ev.GetResource().GetPolicy()
		if p == nil {
			return errors.New("upsert without a policy resource")
		}
		if key == "" {
			return errors.New("policy without a name")
		}
		p = proto.Clone(p).(*apiv1.Policy)
		// Status is for admins; the agent resolves from the policy alone.
		p.StatusJson = nil
		s.Policies[key] = p
	default:
		// Kinds this agent does not know yet (exports in later issues) are ignored,
		// so an older agent keeps working against a newer broker.
	}
	return nil
}

// ClusterNames returns the cluster names, sorted.
func (s *State) ClusterNames() []string {
	out := make([]string, 0, len(s.Clusters))
	for n := range s.Clusters {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// file is the on-disk form: protobuf records in their canonical JSON.
type file struct {
	Revision  uint64            `json:"revision"`
	SavedAt   time.Time         `json:"savedAt"`
	Clusters  []json.RawMessage `json:"clusters"`
	Endpoints []json.RawMessage `json:"endpoints"`
	Policies  []json.RawMessage `json:"policies,omitempty"`
	// Imports are written only once the broker sent some (HasImports).
	Imports []json.RawMessage `json:"imports,omitempty"`
	// HasImports tells an empty set of imports from none received yet.
	HasImports bool `json:"hasImports,omitempty"`
}

// Marshal encodes s as the cache file's JSON, records sorted by key so equal states give equal
// bytes.
func (s *State) Marshal(now time.Time) ([]byte, error) {
	f := file{Revision: s.Revision, SavedAt: now.UTC(), Clusters: []json.RawMessage{}, Endpoints: []json.RawMessage{}}
	for _, k := range sortedKeys(s.Clusters) {
		b, err := protojson.Marshal(s.Clusters[k])
		if err != nil {
			return nil, fmt.Errorf("encode cluster %q: %w", k, err)
		}
		f.Clusters = append(f.Clusters, b)
	}
	for _, k := range sortedKeys(s.Endpoints) {
		b, err := protojson.Marshal(s.Endpoints[k])
		if err != nil {
			return nil, fmt.Errorf("encode endpoint %q: %w", k, err)
		}
		f.Endpoints = append(f.Endpoints, b)
	}
	for _, k := range sortedKeys(s.Policies) {
		b, err := protojson.Marshal(s.Policies[k])
		if err != nil {
			return nil, fmt.Errorf("encode policy %q: %w", k, err)
		}
		f.Policies = append(f.Policies, b)
	}
	f.HasImports = s.HasImports
	for i, imp := range s.Imports {
		b, err := protojson.Marshal(imp)
		if err != nil {
			return nil, fmt.Errorf("encode import %d (%s/%s): %w", i, imp.GetNamespace(), imp.GetName(), err)
		}
		f.Imports = append(f.Imports, b)
	}
	return json.MarshalIndent(f, "", "  ")
}

// Unmarshal decodes a cache file.
func Unmarshal(data []byte) (*State, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode broker state: %w", err)
	}
	s := New()
	s.Revision = f.Revision
	for i, raw := range f.Clusters {
		c := &apiv1.Cluster{}
		if err := protojson.Unmarshal(raw, c); err != nil {
			return nil, fmt.Errorf("decode broker state: clusters[%d]: %w", i, err)
		}
		if c.GetName() == "" {
			return nil, fmt.Errorf("decode broker state: clusters[%d] has no name", i)
		}
		s.Clusters[c.GetName()] = c
	}
	for i, raw := range f.Endpoints {
		e := &apiv1.Endpoint{}
		if err := protojson.Unmarshal(raw, e); err != nil {
			return nil, fmt.Errorf("decode broker state: endpoints[%d]: %w", i, err)
		}
		if e.GetCluster() == "" || e.GetNode() == "" {
			return nil, fmt.Errorf("decode broker state: endpoints[%d] has no cluster or node", i)
		}
		s.Endpoints[EndpointKey(e.GetCluster(), e.GetNode())] = e
	}
	for i, raw := range f.Policies {
		p := &apiv1.Policy{}
		if err := protojson.Unmarshal(raw, p); err != nil {
			return nil, fmt.Errorf("decode broker state: policies[%d]: %w", i, err)
		}
		if p.GetName() == "" {
			return nil, fmt.Errorf("decode broker state: policies[%d] has no name", i)
		}
		s.Policies[p.GetName()] = p
	}
	s.HasImports = f.HasImports || len(f.Imports) > 0
	if s.HasImports {
		s.Imports = []*apiv1.ServiceImport{}
	}
	for i, raw := range f.Imports {
		imp := &apiv1.ServiceImport{}
		if err := protojson.Unmarshal(raw, imp); err != nil {
			return nil, fmt.Errorf("decode broker state: imports[%d]: %w", i, err)
		}
		if imp.GetNamespace() == "" || imp.GetName() == "" {
			return nil, fmt.Errorf("decode broker state: imports[%d] has no namespace or name", i)
		}
		s.Imports = append(s.Imports, imp)
	}
	return s, nil
}

// Save writes s to dir/broker-state.json atomically (temp file, fsync, rename), so a crash
// leaves either the old or the new state, never half of one. The file is 0600: it holds the
// pairs' pre-shared keys.
func (s *State) Save(dir string, now time.Time) error {
	data, err := s.Marshal(now)
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dir, FileName), data, 0o600)
}

// Load reads dir/broker-state.json. A missing file is (nil, nil): there is no cache yet.
func Load(dir string) (*State, error) {
	p := filepath.Join(dir, FileName)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	s, err := Unmarshal(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

// WriteFileAtomic writes data to path through a temp file in the same directory, fsync and a
// rename (statefile.WriteAtomic), naming the path in its errors.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := statefile.WriteAtomic(path, data, perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
