package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Broker is the part of the broker's admin API the dashboard reads; apiv1.AdminClient is one.
// Nothing in it writes: the dashboard is read-only.
type Broker interface {
	ListClusters(ctx context.Context, in *apiv1.ListClustersRequest, opts ...grpc.CallOption) (*apiv1.ListClustersResponse, error)
	ListPolicies(ctx context.Context, in *apiv1.ListPoliciesRequest, opts ...grpc.CallOption) (*apiv1.ListPoliciesResponse, error)
	ListServices(ctx context.Context, in *apiv1.ListServicesRequest, opts ...grpc.CallOption) (*apiv1.ListServicesResponse, error)
	ListCertificates(ctx context.Context, in *apiv1.ListCertificatesRequest, opts ...grpc.CallOption) (*apiv1.ListCertificatesResponse, error)
}

// LinksSource reads the broker's link reports, one item per cluster pair (`cablectl links
// --all`). Nil means the broker has none to give; the pairs are then judged from the policies and
// the gateways alone.
type LinksSource func(ctx context.Context) ([]Link, error)

// refreshEvery bounds how long the policies, services and certificates read at one revision are
// reused: they are read again whenever the store's revision moves, and at least this often.
const refreshEvery = 30 * time.Second

// Poller reads the broker every interval (the broker has no watch for the admin: its watch
// serves agents, with their certificates), builds the document, and tells its subscribers when
// the document changed. It owns its goroutine (Run) and its state.
type Poller struct {
	broker   Broker
	links    LinksSource
	interval time.Duration
	timeout  time.Duration
	log      *slog.Logger

	// Owned by Run's goroutine.
	in          Inputs
	fullAt      time.Time
	fingerprint string
	ex          Explanations

	mu      sync.Mutex
	doc     Mesh
	docJSON []byte // doc as served
	seq     uint64 // counts the changes of doc
	events  []Event
	subs    map[chan struct{}]struct{}
}

// NewPoller makes a poller; interval is how often it asks the broker.
func NewPoller(b Broker, links LinksSource, interval time.Duration, log *slog.Logger) *Poller {
	p := &Poller{broker: b, links: links, interval: interval, timeout: max(5*time.Second, 2*interval), log: log,
		subs: map[chan struct{}]struct{}{}, events: []Event{}}
	p.doc = Mesh{Clusters: []Cluster{}, Links: []Link{}, Pairs: []Pair{}, Policies: []Policy{}, Services: []Service{},
		Warnings: []string{}, Events: []Event{}, Error: "not read from the broker yet"}
	p.docJSON, _ = json.Marshal(p.doc)
	return p
}

// Run polls until ctx ends.
func (p *Poller) Run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.Poll(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll reads the broker once and publishes the document if it changed. Run calls it; tests call
// it directly, with the time they want.
func (p *Poller) Poll(parent context.Context, now time.Time) {
	ctx, cancel := context.WithTimeout(parent, p.timeout)
	defer cancel()
	next, err := p.read(ctx, now)
	if parent.Err() != nil {
		return // shutting down: a failed read now is no news
	}
	if err != nil {
		p.mu.Lock()
		next = p.doc // keep what was seen, say why it is old
		p.mu.Unlock()
		next.Error = err.Error()
		next.GeneratedAt = now.UTC()
		p.log.Warn("dashboard: read the broker", "err", err)
	}
	p.publish(next, now)
}

// read asks the broker for everything the pages show. The clusters and the links every time (a
// gateway's lease and a link's state move without the store's revision); the rest when the
// revision moved or refreshEvery passed.
func (p *Poller) read(ctx context.Context, now time.Time) (Mesh, error) {
	cl, err := p.broker.ListClusters(ctx, &apiv1.ListClustersRequest{})
	if err != nil {
		return Mesh{}, fmt.Errorf("list clusters: %w", err)
	}
	in := p.in
	in.Clusters = cl
	if in.Policies == nil || cl.Revision != p.in.Clusters.GetRevision() || now.Sub(p.fullAt) >= refreshEvery {
		if err := p.readRest(ctx, &in); err != nil {
			return Mesh{}, err
		}
		p.fullAt = now
	}
	in.Links = nil
	if p.links != nil {
		if in.Links, err = p.links(ctx); err != nil {
			return Mesh{}, fmt.Errorf("link reports: %w", err)
		}
	}
	if fp := Fingerprint(in.Clusters, in.Policies); fp != p.fingerprint || p.ex == nil {
		ex, err := Explain(in.Clusters, in.Policies)
		if err != nil {
			return Mesh{}, err
		}
		p.ex, p.fingerprint = ex, fp
	}
	p.in = in
	return Build(in, p.ex, now)
}

func (p *Poller) readRest(ctx context.Context, in *Inputs) error {
	var err error
	if in.Policies, err = p.broker.ListPolicies(ctx, &apiv1.ListPoliciesRequest{}); err != nil {
		return fmt.Errorf("list policies: %w", err)
	}
	if in.Services, err = p.broker.ListServices(ctx, &apiv1.ListServicesRequest{}); err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	if in.Certs, err = p.broker.ListCertificates(ctx, &apiv1.ListCertificatesRequest{}); err != nil {
		return fmt.Errorf("list certificates: %w", err)
	}
	return nil
}

// publish makes next the current document when it differs from it (generatedAt aside), with the
// events between the two, and wakes the subscribers.
func (p *Poller) publish(next Mesh, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := p.seq == 0
	if !first {
		evs := Diff(&p.doc, &next, now)
		slices.Reverse(evs)
		p.events = append(evs, p.events...)
		if len(p.events) > MaxEvents {
			p.events = p.events[:MaxEvents]
		}
	}
	next.Events = p.events
	if !first && sameContent(p.doc, next) {
		return
	}
	b, err := json.Marshal(next)
	if err != nil {
		p.log.Error("dashboard: encode the mesh", "err", err)
		return
	}
	p.doc, p.docJSON = next, b
	p.seq++
	for ch := range p.subs {
		select {
		case ch <- struct{}{}:
		default: // it has a wake-up pending: it will read the newest document
		}
	}
}

// sameContent compares two documents without their generatedAt.
func sameContent(a, b Mesh) bool {
	a.GeneratedAt, b.GeneratedAt = time.Time{}, time.Time{}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// Current returns the current document as JSON and its sequence number (0: never read).
func (p *Poller) Current() ([]byte, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.docJSON, p.seq
}

// Subscribe returns a channel that receives a value whenever the document changes (changes
// coalesce: a slow reader gets one wake-up for several), and the function that ends the
// subscription.
func (p *Poller) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.subs[ch] = struct{}{}
	p.mu.Unlock()
	return ch, func() {
		p.mu.Lock()
		delete(p.subs, ch)
		p.mu.Unlock()
	}
}
