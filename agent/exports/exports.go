package exports

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/internal/statefile"
	"github.com/cablemesh/cablemesh/internal/syncloop"
	"github.com/cablemesh/cablemesh/mcs"
)

// A node's exports come from three sources: the config file (exports:), the runtime exports
// made with `cablectl service export --socket` (kept in stateDir/exports.json so that they
// survive a restart) and, with kubernetes.enabled, the cluster's MCS ServiceExport objects. Their
// union is the node's complete set, sent whole to the broker (SetExports) whenever it changes
// and after every (re)connect, retried with backoff until the broker has it. One namespace/name
// is defined by one source: the config wins over a runtime export, which wins over Kubernetes.

// Export sources.
const (
	SourceConfig     = "config"
	SourceRuntime    = "runtime"
	SourceKubernetes = "kubernetes"
)

// ExportsFile is the runtime exports' file in the state dir.
const ExportsFile = "exports.json"

// Source is a source of exports that change on their own (Kubernetes): Run calls onChange
// with the complete set whenever it changes, until ctx ends.
type Source interface {
	Run(ctx context.Context, onChange func([]*apiv1.ServiceExport)) error
}

// ConflictSink is a Source that also wants the broker's conflicts of this cluster's exports
// after every sync (Kubernetes writes them as the ServiceExports' Conflict condition).
type ConflictSink interface {
	SetConflicts([]statusapi.ServiceConflict)
}

// ErrExportRefused is wrapped by the runtime export errors that are not bad input: the export is
// defined elsewhere (409) or not at all (404).
var ErrExportRefused = errors.New("export refused")

// Exports is the component: it holds the sources and what the broker last acknowledged. mu
// guards the fields below it; Deps.Scope and Deps.Live are called with it held (their locks come
// after it), Deps.OnChange too (it only fires triggers).
type Exports struct {
	cfg  config.Static // cluster, node, stateDir
	deps Deps
	log  *slog.Logger

	mu      sync.Mutex
	config  []*apiv1.ServiceExport          // normalised, from the config file
	runtime map[string]*apiv1.ServiceExport // by namespace/name, normalised
	kube    []*apiv1.ServiceExport
	// version counts changes of the set; synced is the version the broker acknowledged.
	version, synced uint64
	sync            statusapi.ExportSync
	loop            syncloop.Loop
	// sink, when the running source is a ConflictSink, hears the conflicts of every sync.
	sink atomic.Pointer[ConflictSink]
}

// Deps are what the exports take from the rest of the agent.
type Deps struct {
	Log *slog.Logger
	// Live is the live config in force: its exports at New (a reload hands new ones to
	// ApplyConfig), and to name an export of the config file by its index.
	Live func() config.Live
	// Scope is where this cluster's endpoints may be (false: not known yet, nothing is checked).
	Scope func() (mcs.EndpointScope, bool)
	// Stamp stamps the ingress ports on the exports sent (gateway mode).
	Stamp func([]*apiv1.ServiceExport)
	// OnChange is called when the set changes (the ingress follows it).
	OnChange func()
	Backoff  func() *retry.Backoff
	Link     Link
}

// Link is the broker connection as the sync loop sees it.
type Link interface {
	// Generation names the connection a call goes over: a refusal counts only on the one in use.
	Generation() uint64
	// CertificateRefused is the broker's words once it refused this node's certificate for good.
	CertificateRefused() string
	// RefusedForGood records err, got over connection gen, when it is such a refusal.
	RefusedForGood(err error, gen uint64) bool
}

// New returns the exports of cfg with the config file's own (those in force); Load reads the
// runtime ones.
func New(cfg config.Static, deps Deps) *Exports {
	return &Exports{cfg: cfg, deps: deps, log: deps.Log, config: deps.Live().ExportsProto(), runtime: map[string]*apiv1.ServiceExport{}}
}

// Load reads the runtime exports of the state dir; a file that cannot be read ends the agent.
func (x *Exports) Load() error {
	runtime, err := loadRuntime(x.cfg.StateDir)
	if err != nil {
		return err
	}
	x.mu.Lock()
	x.runtime = runtime
	x.mu.Unlock()
	return nil
}

// ApplyConfig takes the exports of a reloaded config file.
func (x *Exports) ApplyConfig(next config.Live) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.config = next.ExportsProto()
	x.changedLocked()
}

// exportsFile is the on-disk form of the runtime exports.
type exportsFile struct {
	Exports []config.Export `json:"exports"`
}

// loadRuntime reads stateDir/exports.json (none: no runtime exports). A file that does
// not decode or validate is an error: silently dropping it would withdraw those exports.
func loadRuntime(dir string) (map[string]*apiv1.ServiceExport, error) {
	path := filepath.Join(dir, ExportsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]*apiv1.ServiceExport{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runtime exports: %w", err)
	}
	var f exportsFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("runtime exports %s: %w (fix or remove the file)", path, err)
	}
	out := map[string]*apiv1.ServiceExport{}
	for i, e := range f.Exports {
		p, err := config.NormalizeExport(fmt.Sprintf("exports[%d]", i), e)
		if err != nil {
			return nil, fmt.Errorf("runtime exports %s: %w (fix or remove the file)", path, err)
		}
		out[mcs.Key(p.Namespace, p.Name)] = p
	}
	return out, nil
}

// saveRuntime writes the runtime exports atomically.
func saveRuntime(dir string, exports map[string]*apiv1.ServiceExport) error {
	f := exportsFile{Exports: []config.Export{}}
	for _, k := range slices.Sorted(maps.Keys(exports)) {
		f.Exports = append(f.Exports, config.ExportFromProto(exports[k]))
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("runtime exports: %w", err)
	}
	if err := statefile.WriteAtomic(filepath.Join(dir, ExportsFile), data, 0o600); err != nil {
		return fmt.Errorf("runtime exports: write %s: %w", filepath.Join(dir, ExportsFile), err)
	}
	return nil
}

// sourcedExport is one export with its source.
type sourcedExport struct {
	e      *apiv1.ServiceExport
	source string
}

// MergeExports is the node's complete set from its sources (config over runtime over
// Kubernetes), sorted by namespace/name, and a status row for every export of every source
// (with the source that shadows it, if any). It is pure.
func MergeExports(cfg, runtime, kube []*apiv1.ServiceExport) ([]*apiv1.ServiceExport, []statusapi.NodeExport) {
	winner := map[string]string{}
	var all []sourcedExport
	var out []*apiv1.ServiceExport
	for _, src := range []struct {
		name string
		list []*apiv1.ServiceExport
	}{{SourceConfig, cfg}, {SourceRuntime, runtime}, {SourceKubernetes, kube}} {
		for _, e := range src.list {
			all = append(all, sourcedExport{e, src.name})
			k := mcs.Key(e.GetNamespace(), e.GetName())
			if _, taken := winner[k]; taken {
				continue
			}
			winner[k] = src.name
			out = append(out, e)
		}
	}
	byKey := func(a, b *apiv1.ServiceExport) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	}
	slices.SortFunc(out, byKey)
	rows := make([]statusapi.NodeExport, 0, len(all))
	for _, s := range all {
		row := statusapi.NodeExport{Export: exportView(s.e), Source: s.source}
		if w := winner[mcs.Key(s.e.GetNamespace(), s.e.GetName())]; w != s.source {
			row.Shadowed = w
		}
		rows = append(rows, row)
	}
	slices.SortStableFunc(rows, func(a, b statusapi.NodeExport) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out, rows
}

// exportView is an export as the status and the API show it.
func exportView(e *apiv1.ServiceExport) statusapi.Export {
	v := statusapi.Export{Name: e.GetName(), Namespace: e.GetNamespace(), Type: e.GetType(), Affinity: e.GetAffinity(),
		Labels: maps.Clone(e.GetLabels()), Ports: []statusapi.ServicePort{}, Endpoints: []statusapi.ServiceEndpoint{}}
	for _, p := range e.GetPorts() {
		v.Ports = append(v.Ports, statusapi.ServicePort{Name: p.GetName(), Port: p.GetPort(), Protocol: p.GetProtocol()})
	}
	for _, ep := range e.GetEndpoints() {
		v.Endpoints = append(v.Endpoints, statusapi.ServiceEndpoint{IP: ep.GetIp(), Hostname: ep.GetHostname(), Ready: ep.GetReady()})
	}
	return v
}

// exportFromView is the config form of an export sent over the API.
func exportFromView(v statusapi.Export) config.Export {
	e := config.Export{Name: v.Name, Namespace: v.Namespace, Type: v.Type, Labels: v.Labels, Affinity: v.Affinity}
	for _, p := range v.Ports {
		e.Ports = append(e.Ports, config.ExportPort{Name: p.Name, Port: int(p.Port), Protocol: p.Protocol})
	}
	for _, ep := range v.Endpoints {
		r := ep.Ready
		e.Endpoints = append(e.Endpoints, config.ExportEndpoint{IP: ep.IP, Hostname: ep.Hostname, Ready: &r})
	}
	return e
}

// effective is the node's complete set, each export stamped with this node's cluster and name.
func (x *Exports) Effective() ([]*apiv1.ServiceExport, []statusapi.NodeExport, uint64) {
	scope, known := x.deps.Scope()
	x.mu.Lock()
	runtime := make([]*apiv1.ServiceExport, 0, len(x.runtime))
	for _, k := range slices.Sorted(maps.Keys(x.runtime)) {
		runtime = append(runtime, x.runtime[k])
	}
	kube, _ := kubeExportsInScope(scope, known, x.kube)
	set, rows := MergeExports(x.config, runtime, kube)
	version := x.version
	x.mu.Unlock()
	out := make([]*apiv1.ServiceExport, len(set))
	for i, e := range set {
		e = proto.Clone(e).(*apiv1.ServiceExport)
		e.Cluster, e.Node = x.cfg.Cluster, x.cfg.Node
		out[i] = e
	}
	x.deps.Stamp(out)
	return out, rows, version
}

// changedLocked records a change of the set and wakes the sync loop.
func (x *Exports) changedLocked() {
	x.version++
	x.Trigger()
	x.deps.OnChange()
}

// Trigger asks the sync loop to send the node's exports to the broker.
func (x *Exports) Trigger() { x.loop.Trigger() }

// setKube replaces the Kubernetes source's exports; they are normalised, and one that
// does not validate is left out with a warning.
func (x *Exports) setKube(list []*apiv1.ServiceExport) {
	var keep []*apiv1.ServiceExport
	for i, e := range list {
		e = proto.Clone(e).(*apiv1.ServiceExport)
		if err := mcs.Normalize(fmt.Sprintf("kubernetes export %d (%s/%s)", i, e.GetNamespace(), e.GetName()), e); err != nil {
			x.log.Warn("Kubernetes ServiceExport left out", "err", err)
			continue
		}
		keep = append(keep, e)
	}
	scope, known := x.deps.Scope()
	if _, msgs := kubeExportsInScope(scope, known, keep); len(msgs) > 0 {
		x.log.Warn("Kubernetes endpoints outside this cluster left out of its exports", "endpoints", msgs)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if slices.EqualFunc(keep, x.kube, func(x, y *apiv1.ServiceExport) bool { return proto.Equal(x, y) }) {
		return
	}
	x.kube = keep
	x.changedLocked()
}

// PutExport exports (or replaces) a runtime export. Bad input is an error naming the field and
// the value; an export the config file defines is refused (ErrExportRefused). Nothing changes,
// in memory or on disk, unless it succeeds.
func (x *Exports) PutExport(v statusapi.Export) (statusapi.ExportResult, error) {
	p, err := config.NormalizeExport("export", exportFromView(v))
	if err != nil {
		return statusapi.ExportResult{}, err
	}
	if err := x.checkScope("export", v); err != nil {
		return statusapi.ExportResult{}, err
	}
	k := mcs.Key(p.Namespace, p.Name)
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, c := range x.config {
		if mcs.Key(c.Namespace, c.Name) == k {
			return statusapi.ExportResult{}, fmt.Errorf("%w: %s is defined in the agent config file (exports[%d]); change it there", ErrExportRefused, k, configIndex(x.deps.Live(), c, i))
		}
	}
	next := maps.Clone(x.runtime)
	next[k] = p
	if err := saveRuntime(x.cfg.StateDir, next); err != nil {
		return statusapi.ExportResult{}, err
	}
	if old := x.runtime[k]; old == nil || !proto.Equal(old, p) {
		x.runtime = next
		x.changedLocked()
		x.log.Info("service exported at run time", "service", k, "ports", len(p.Ports), "endpoints", len(p.Endpoints))
	}
	return statusapi.ExportResult{Export: exportView(p), Source: SourceRuntime}, nil
}

// DeleteExport withdraws a runtime export. An export of the config file or of Kubernetes is
// refused, saying where it is defined; one that does not exist is ErrExportRefused too.
func (x *Exports) DeleteExport(namespace, name string) error {
	k := mcs.Key(namespace, name)
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, c := range x.config {
		if mcs.Key(c.Namespace, c.Name) == k {
			return fmt.Errorf("%w: %s is defined in the agent config file (exports[%d]); remove it there", ErrExportRefused, k, configIndex(x.deps.Live(), c, i))
		}
	}
	if _, ok := x.runtime[k]; !ok {
		for _, e := range x.kube {
			if mcs.Key(e.Namespace, e.Name) == k {
				return fmt.Errorf("%w: %s is exported by its Kubernetes ServiceExport; delete that object", ErrExportRefused, k)
			}
		}
		return fmt.Errorf("%w: %s: %w", ErrExportRefused, k, errNoSuchExport)
	}
	next := maps.Clone(x.runtime)
	delete(next, k)
	if err := saveRuntime(x.cfg.StateDir, next); err != nil {
		return err
	}
	x.runtime = next
	x.changedLocked()
	x.log.Info("runtime export withdrawn", "service", k)
	return nil
}

var errNoSuchExport = errors.New("no runtime export of that name on this node")

// configIndex is the index of c in the config file's exports (i when the lists agree).
func configIndex(live config.Live, c *apiv1.ServiceExport, i int) int {
	for j, e := range live.Exports {
		if e.Namespace == c.Namespace && e.Name == c.Name {
			return j
		}
	}
	return i
}

// Status returns the rows of the node's exports and the sync state.
func (x *Exports) Status() ([]statusapi.NodeExport, statusapi.ExportSync) {
	_, rows, version := x.Effective()
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.sync
	s.InSync = s.Error == "" && x.synced == version && s.LastSync != nil
	s.Conflicts = slices.Clone(s.Conflicts)
	return rows, s
}

// Run sends the node's exports to the broker whenever they change and after every
// (re)connect of the watch, retrying with backoff until the broker has them.
func (x *Exports) Run(ctx context.Context, client apiv1.AgentClient) {
	var gen uint64 // the broker connection a send went over: a refusal ends the loop only on it
	x.loop.Run(ctx, "this node's exports", func(ctx context.Context) error {
		set, _, version := x.Effective()
		gen = x.deps.Link.Generation()
		return x.send(ctx, client, set, version)
	}, syncloop.Options{
		Backoff: x.deps.Backoff(),
		Log:     x.log,
		// Retrying the same set cannot help: wait for the next change or reconnect.
		Refused: func(err error) bool {
			return brokerclient.RefusedCode(err, codes.InvalidArgument, codes.PermissionDenied, codes.Unimplemented)
		},
		Stop: func(err error) bool {
			if err == nil {
				return x.deps.Link.CertificateRefused() != ""
			}
			return x.deps.Link.RefusedForGood(err, gen)
		},
	})
}

// send makes one SetExports call and records its outcome.
func (x *Exports) send(ctx context.Context, client apiv1.AgentClient, set []*apiv1.ServiceExport, version uint64) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := client.SetExports(cctx, &apiv1.SetExportsRequest{Exports: set})
	now := time.Now().UTC()
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil {
		x.sync.Error = brokerclient.RPCMessage(err)
		return fmt.Errorf("set exports: %w", err)
	}
	var conflicts []statusapi.ServiceConflict
	for _, c := range resp.GetConflicts() {
		conflicts = append(conflicts, statusapi.ServiceConflict{Cluster: c.GetCluster(), Field: c.GetField(), Message: c.GetMessage()})
	}
	if !slices.Equal(conflicts, x.sync.Conflicts) {
		for _, c := range conflicts {
			x.log.Warn("service export in conflict; the oldest export wins", "field", c.Field, "reason", c.Message)
		}
	}
	x.synced = version
	x.sync = statusapi.ExportSync{Revision: resp.GetRevision(), LastSync: &now, Conflicts: conflicts}
	if sink := x.sink.Load(); sink != nil {
		(*sink).SetConflicts(slices.Clone(conflicts))
	}
	x.log.Debug("exports sent to the broker", "exports", len(set), "revision", resp.GetRevision(), "conflicts", len(conflicts))
	return nil
}

// RunSource runs the Kubernetes source until ctx ends, restarting it with backoff when it
// fails.
func (x *Exports) RunSource(ctx context.Context, src Source) {
	if sink, ok := src.(ConflictSink); ok {
		x.sink.Store(&sink)
		x.mu.Lock()
		conflicts, synced := slices.Clone(x.sync.Conflicts), x.sync.LastSync != nil
		x.mu.Unlock()
		if synced {
			sink.SetConflicts(conflicts)
		}
	}
	syncloop.RunSource(ctx, x.log, "Kubernetes export source", x.deps.Backoff(), func(ctx context.Context) error {
		return src.Run(ctx, x.setKube)
	})
}
