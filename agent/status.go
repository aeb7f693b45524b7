package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/internal/version"
)

// Status builds the status document. Connection state, counters and handshakes come from the
// driver (what the device says), one row per remote cluster this node wants a connection to; a
// wanted connection the device does not have is reported in state error. With health probes on,
// each row also carries the probes' RTT and health, and a connection whose probes failed
// healthCheck.failureThreshold times in a row is in error whatever the device says
// (health.Merge).
func (a *Agent) Status(ctx context.Context) statusapi.Status {
	p := a.plan()
	st := p.State
	connected, rev, last, errMsg, cached := a.brokerStatus()
	out := statusapi.Status{
		Cluster: a.cfg.Cluster,
		Node:    a.cfg.Node,
		Gateway: a.cfg.Gateway,
		Version: version.String(),
		Broker: statusapi.Broker{
			Address:   a.cfg.Broker,
			Connected: connected,
			Revision:  rev,
			Error:     errMsg,
			Cached:    cached,
		},
		Connections: []statusapi.Connection{},
	}
	if c := st.Clusters[a.cfg.Cluster]; c != nil {
		out.ClusterID = c.GetId()
	} else if c := a.localCluster(); c != nil {
		out.ClusterID = c.GetId()
	}
	if !last.IsZero() {
		t := last.UTC()
		out.Broker.LastContact = &t
	}
	a.clock.fill(&out.Broker)
	out.Problems = append(out.Problems, a.certStatus(&out.Broker)...)
	out.Problems = append(out.Problems, a.clusterPolicyProblems()...)
	if p := tokenFileProblem(a.cfg.JoinTokenFile); p != "" {
		out.Problems = append(out.Problems, statusapi.Problem{Message: p})
	}
	out.Config = a.configStatus()
	out.Problems = append(out.Problems, a.configProblems()...)
	out.Services = a.servicesStatus()
	out.Ingress = a.ingressStatus()
	var dataplane *statusapi.IngressDataplane
	out.MeshAddress, dataplane = a.meshStatus()
	if out.Ingress != nil {
		out.Ingress.Dataplane = dataplane
	}
	out.Problems = append(out.Problems, ingressProblems(out.Ingress)...)
	a.mu.Lock()
	r := a.reconciler
	a.mu.Unlock()
	if !a.cfg.Gateway || r == nil {
		if !a.cfg.Gateway {
			// The routes via the gateway leave out what the guard refuses too.
			out.Problems = append(out.Problems, statusProblems(p.Problems)...)
			out.Worker = a.workerStatus()
		}
		return out
	}
	for _, name := range a.liveConfig().CableDrivers {
		ds := statusapi.DriverStatus{Name: name}
		if err, ok := a.driverSet()[name]; ok && err == nil {
			ds.Running = true
		} else if err != nil {
			ds.Error = err.Error()
		}
		for _, d := range a.runningDrivers() {
			if d.Name() == name {
				ds.Port = int(d.LocalEndpoint().Port)
				ds.Daemon = driverDaemon(ctx, d)
			}
		}
		out.Drivers = append(out.Drivers, ds)
	}
	desired, problems, decisions := p.Wants, p.Problems, p.Decisions
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	observed, obsErrs := r.Observe(octx)
	cancel()
	out.Connections = BuildConnections(desired, problems, observed, obsErrs, r.Applied(), r.Failures(), func(name string) uint32 {
		return st.Clusters[name].GetId()
	})
	for _, d := range decisions {
		out.Decisions = append(out.Decisions, statusapi.Decision{Cluster: d.Cluster, Connect: d.Connect, Driver: d.Driver, Policy: d.Policy, Default: d.Default, Mode: d.Mode})
	}
	if m := a.healthManager(); m != nil {
		a.mu.Lock()
		reasons := a.healthReasons
		a.mu.Unlock()
		out.Connections = applyHealth(out.Connections, m.Result, reasons, m.Settings())
	}
	if tr := a.datapath().Traffic(); tr != nil {
		for i := range out.Connections {
			c := tr[out.Connections[i].ClusterID]
			out.Connections[i].Traffic = &statusapi.Traffic{RxPackets: c.RxPackets, RxBytes: c.RxBytes, TxPackets: c.TxPackets, TxBytes: c.TxBytes}
		}
	}
	out.Connections = withPartialProblems(out.Connections, problems)
	out.Problems = append(out.Problems, statusProblems(problems)...)
	return out
}

// BuildConnections joins what is wanted with what the drivers report. It is pure. observed has
// an entry for every driver that could be read, obsErrs the error of those that could not;
// applied is what this process last connected (for AppliedRevision), failed the pairs whose last
// Connect failed: their state is error with the driver's own words, whatever the device shows.
func BuildConnections(desired []reconcile.Want, problems []reconcile.Problem, observed map[string][]cable.ConnectionStatus, obsErrs map[string]error, applied map[string]reconcile.Applied, failed map[string]reconcile.Failure, clusterID func(string) uint32) []statusapi.Connection {
	out := []statusapi.Connection{}
	for _, w := range desired {
		d := w.Remote
		c := statusapi.Connection{
			Cluster:   d.Cluster,
			ClusterID: d.ClusterID,
			Node:      d.Node,
			Driver:    w.Driver,
			Mode:      reconcile.ModeDirect,
			Policy:    w.Policy,
			Endpoint:  reconcile.EndpointString(d),
		}
		if w.GatewayMode {
			c.Mode = reconcile.ModeGateway
		}
		if ap, ok := applied[d.Cluster]; ok && reconcile.EqualWant(ap.Want, w) {
			c.AppliedRevision = ap.Revision
		}
		for _, p := range d.Subnets {
			c.Subnets = append(c.Subnets, p.String())
		}
		var o cable.ConnectionStatus
		ok := false
		for _, x := range observed[w.Driver] {
			if x.Cluster == d.Cluster {
				o, ok = x, true
				break
			}
		}
		if ok {
			c.RxBytes, c.TxBytes, c.MTU = o.RxBytes, o.TxBytes, o.MTU
			if o.Endpoint != "" {
				c.Endpoint = o.Endpoint
			}
			if o.Node != "" {
				c.Node = o.Node
			}
			if !o.LastHandshake.IsZero() {
				t := o.LastHandshake.UTC()
				c.LastHandshake = &t
			}
		}
		f, hasFailed := failed[d.Cluster]
		switch {
		case hasFailed && reconcile.EqualWant(f.Want, w):
			c.State = string(cable.StateError)
			c.Message = w.Driver + " could not connect the pair: " + f.Err.Error()
		case obsErrs[w.Driver] != nil:
			c.State = string(cable.StateError)
			c.Message = "cannot read the " + w.Driver + " device: " + obsErrs[w.Driver].Error()
		case !ok:
			c.State = string(cable.StateError)
			c.Message = "connection is wanted but missing on the " + w.Driver + " device"
		default:
			c.State = string(o.State)
			c.Message = o.Message
		}
		out = append(out, c)
	}
	for _, p := range problems {
		if p.Cluster == "" || p.Partial {
			continue
		}
		out = append(out, statusapi.Connection{
			Cluster:   p.Cluster,
			ClusterID: clusterID(p.Cluster),
			Driver:    p.Driver,
			Policy:    p.Policy,
			State:     string(cable.StateError),
			Message:   p.Message,
		})
	}
	return out
}

// withPartialProblems adds to each connection's message the problems of its pair that leave it
// connected (a subnet left out), after whatever the device and the probes said.
func withPartialProblems(conns []statusapi.Connection, problems []reconcile.Problem) []statusapi.Connection {
	for i := range conns {
		c := &conns[i]
		for _, p := range problems {
			if !p.Partial || p.Cluster != c.Cluster {
				continue
			}
			if c.Message != "" {
				c.Message += "; "
			}
			c.Message += p.Message
		}
	}
	return conns
}

// statusProblems are the planner's problems of remote clusters as status problems.
func statusProblems(problems []reconcile.Problem) []statusapi.Problem {
	var out []statusapi.Problem
	for _, p := range problems {
		if p.Cluster != "" {
			out = append(out, statusapi.Problem{Cluster: p.Cluster, Message: p.Message})
		}
	}
	return out
}

type server struct{ close func() }

// serveStatus listens on the status socket: parent dir created, a stale socket removed (but not
// a live one: that is another agent), mode 0660.
func (a *Agent) serveStatus(ctx context.Context) (*server, error) {
	path := a.cfg.StatusSocket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("statusSocket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, 300*time.Millisecond); err == nil {
			c.Close()
			return nil, fmt.Errorf("statusSocket %s: another process is serving on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("statusSocket %s: remove stale socket: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("statusSocket %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.Path, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Status(r.Context()))
	})
	mux.HandleFunc("GET "+statusapi.ServicesPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.servicesStatus())
	})
	mux.HandleFunc("PUT "+statusapi.ExportsPath+"{namespace}/{name}", a.handlePutExport)
	mux.HandleFunc("DELETE "+statusapi.ExportsPath+"{namespace}/{name}", a.handleDeleteExport)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("status server stopped", "err", err)
		}
	}()
	return &server{close: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
		_ = os.Remove(path)
	}}, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// maxExportBody bounds a runtime export's JSON (4096 endpoints fit comfortably).
const maxExportBody = 4 << 20

// handlePutExport is PUT /v1/exports/{namespace}/{name}: the body is a statusapi.Export whose
// namespace and name, when set, must be the path's.
func (a *Agent) handlePutExport(w http.ResponseWriter, r *http.Request) {
	var v statusapi.Export
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxExportBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		writeJSON(w, http.StatusBadRequest, statusapi.Error{Error: "decode export: " + err.Error()})
		return
	}
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if v.Namespace == "" {
		v.Namespace = ns
	}
	if v.Name == "" {
		v.Name = name
	}
	if v.Namespace != ns || v.Name != name {
		writeJSON(w, http.StatusBadRequest, statusapi.Error{Error: fmt.Sprintf("export %s/%s sent to the path of %s/%s", v.Namespace, v.Name, ns, name)})
		return
	}
	res, err := a.PutExport(v)
	if err != nil {
		writeJSON(w, exportErrorCode(err), statusapi.Error{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// handleDeleteExport is DELETE /v1/exports/{namespace}/{name}.
func (a *Agent) handleDeleteExport(w http.ResponseWriter, r *http.Request) {
	if err := a.DeleteExport(r.PathValue("namespace"), r.PathValue("name")); err != nil {
		writeJSON(w, exportErrorCode(err), statusapi.Error{Error: err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// exportErrorCode maps a runtime export error to its HTTP status.
func exportErrorCode(err error) int {
	switch {
	case errors.Is(err, errNoSuchExport):
		return http.StatusNotFound
	case errors.Is(err, ErrExportRefused):
		return http.StatusConflict
	case errors.Is(err, os.ErrPermission), strings.Contains(err.Error(), "runtime exports:"):
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest
}
