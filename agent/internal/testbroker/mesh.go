package testbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
)

// The rest of the mesh, as the broker's store holds it: what the broker's admission writes when
// other clusters are created, their gateways register and their agents export, written here
// directly, so that a test can drive the mesh around the one agent it runs.

// exportNode is the node the simulated exports of a cluster come from.
const exportNode = "exporter"

// view reads the store; it fails only on a closed store, which lives as long as the test.
func (b *Broker) view(fn func(store.ReadTx) error) {
	if err := b.store.View(context.Background(), fn); err != nil {
		panic(fmt.Sprintf("testbroker: read the store: %v", err))
	}
}

// update writes the store; it fails only on a record without its key (a test's mistake).
func (b *Broker) update(fn func(store.Tx) error) {
	if _, err := b.store.Update(context.Background(), fn); err != nil {
		panic(fmt.Sprintf("testbroker: write the store: %v", err))
	}
}

// clusterUID is the UID given to a cluster created here.
func clusterUID(cluster string) string { return "uid-" + cluster }

// UpsertCluster stores a cluster record, as CreateJoinToken creates one and LabelCluster
// changes it. A cluster keeps its UID (the incarnation its agents' certificates name).
func (b *Broker) UpsertCluster(c *apiv1.Cluster) {
	c = proto.Clone(c).(*apiv1.Cluster)
	b.update(func(tx store.Tx) error {
		old, err := tx.Cluster(c.Name)
		if err != nil {
			return err
		}
		switch {
		case c.Uid != "":
		case old != nil:
			c.Uid = old.Uid
		default:
			c.Uid = clusterUID(c.Name)
		}
		return tx.PutCluster(c)
	})
}

// UpsertPolicy stores a connection policy record (Json is policy.ClusterConnectionPolicy as
// JSON; IsDefault marks the mesh default), as ApplyPolicies does.
func (b *Broker) UpsertPolicy(p *apiv1.Policy) {
	b.update(func(tx store.Tx) error { return tx.PutPolicy(p) })
}

// DeletePolicy removes a policy.
func (b *Broker) DeletePolicy(name string) {
	b.update(func(tx store.Tx) error { return tx.DeletePolicy(name) })
}

// UpsertEndpoint stores an endpoint record, as the registration of another cluster's gateway
// does. It holds no lease: it stays until DeleteEndpoint.
func (b *Broker) UpsertEndpoint(e *apiv1.Endpoint) {
	b.update(func(tx store.Tx) error { return tx.PutEndpoint(e) })
}

// DeleteEndpoint withdraws an endpoint, as a lease expiry would.
func (b *Broker) DeleteEndpoint(cluster, node string) {
	b.update(func(tx store.Tx) error { return tx.DeleteEndpoint(cluster, node) })
}

// Endpoint returns a copy of a registered endpoint, or nil.
func (b *Broker) Endpoint(cluster, node string) *apiv1.Endpoint {
	var e *apiv1.Endpoint
	b.view(func(tx store.ReadTx) (err error) {
		e, err = tx.Endpoint(cluster, node)
		return err
	})
	return e
}

// Revision is the store revision.
func (b *Broker) Revision() uint64 {
	var rev uint64
	b.view(func(tx store.ReadTx) error {
		rev = tx.Revision()
		return nil
	})
	return rev
}

// Token returns a join token for cluster (which must exist) good for one node, signed with the
// broker's token key and recorded as CreateJoinToken records it, that expires after validFor (a
// negative one: already expired, which CreateJoinToken would not make).
func (b *Broker) Token(cluster string, validFor time.Duration) string {
	p := b.loadPKI()
	now := time.Now()
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	claims := jointoken.Claims{Cluster: cluster, Expires: now.Add(validFor), CAHash: p.CAHash(), Nonce: hex.EncodeToString(nonce)}
	b.update(func(tx store.Tx) error {
		c, err := tx.Cluster(cluster)
		if err != nil {
			return err
		}
		if c == nil {
			return fmt.Errorf("no cluster %q to make a token for: UpsertCluster it first", cluster)
		}
		claims.ClusterUID = c.Uid
		return tx.PutJoinToken(admission.NewTokenRecord(claims.Nonce, c, admission.DefaultTokenNodes, claims.Expires, now))
	})
	t, err := jointoken.Sign(claims, p.TokenKey)
	if err != nil {
		panic(err)
	}
	return t
}

// PairPSK is the pre-shared key the broker gives the agents of clusters a and c for their pair.
func (b *Broker) PairPSK(a, c string) []byte {
	var uidA, uidC string
	b.view(func(tx store.ReadTx) error {
		ca, err := tx.Cluster(a)
		if err != nil {
			return err
		}
		cc, err := tx.Cluster(c)
		uidA, uidC = ca.GetUid(), cc.GetUid()
		return err
	})
	return broker.PairPSK(b.readFile(broker.MeshSecretFile), uidA, uidC)
}

// SetImports makes the mesh's imports those given, as seen by the agents of cluster: each
// ImportedCluster becomes that (other) cluster's export of the service, its VIPs the broker's
// allocation, and the broker merges them into the imports every watch gets. The exports set
// before are withdrawn.
func (b *Broker) SetImports(cluster string, imports ...*apiv1.ServiceImport) {
	exports := map[string]*apiv1.ServiceExport{}
	vips := map[string]*apiv1.ServiceVIP{}
	created := time.Now()
	for _, imp := range imports {
		if len(imp.GetVips()) > 0 {
			vips[store.ServiceVIPKey(imp.Namespace, imp.Name)] = &apiv1.ServiceVIP{Namespace: imp.Namespace, Name: imp.Name,
				Vips: imp.Vips, Allocated: timestamppb.New(created)}
		}
		for _, ic := range imp.GetClusters() {
			if ic.Cluster == cluster {
				panic(fmt.Sprintf("testbroker: cluster %s cannot import its own export of %s/%s", cluster, imp.Namespace, imp.Name))
			}
			labels := maps.Clone(ic.GetLabels())
			if labels == nil {
				labels = map[string]string{}
			}
			if _, ok := labels[mcs.LabelExported]; !ok {
				labels[mcs.LabelExported] = "true"
			}
			e := &apiv1.ServiceExport{Cluster: ic.Cluster, Node: exportNode, Namespace: imp.Namespace, Name: imp.Name,
				Type: imp.Type, Ports: ic.Ports, Labels: labels, Endpoints: ic.Endpoints, Affinity: ic.Affinity,
				Created: timestamppb.New(created)}
			exports[store.ServiceExportKey(e.Cluster, e.Node, e.Namespace, e.Name)] = e
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.update(func(tx store.Tx) error { return replaceExports(tx, exports, vips, b.simulatedVIPs) })
	b.simulatedVIPs = map[string]bool{}
	for k := range vips {
		b.simulatedVIPs[k] = true
	}
}

// replaceExports makes the simulated exports and VIPs those given; oldVIPs are the VIPs
// simulated before (the others are the agents' own exports').
func replaceExports(tx store.Tx, exports map[string]*apiv1.ServiceExport, vips map[string]*apiv1.ServiceVIP, oldVIPs map[string]bool) error {
	old, err := tx.ServiceExports()
	if err != nil {
		return err
	}
	for _, e := range old {
		if _, keep := exports[store.ServiceExportKey(e.Cluster, e.Node, e.Namespace, e.Name)]; e.Node == exportNode && !keep {
			if err := tx.DeleteServiceExport(e.Cluster, e.Node, e.Namespace, e.Name); err != nil {
				return err
			}
		}
	}
	for _, e := range exports {
		if err := tx.PutServiceExport(e); err != nil {
			return err
		}
	}
	for k := range oldVIPs {
		if _, keep := vips[k]; !keep {
			ns, name, _ := strings.Cut(k, "/")
			if err := tx.DeleteServiceVIP(ns, name); err != nil {
				return err
			}
		}
	}
	for _, v := range vips {
		if err := tx.PutServiceVIP(v); err != nil {
			return err
		}
	}
	return nil
}

// Exports returns what cluster/node exported as the broker stored it, and how many SetExports
// calls succeeded.
func (b *Broker) Exports(cluster, node string) ([]*apiv1.ServiceExport, int) {
	var out []*apiv1.ServiceExport
	b.view(func(tx store.ReadTx) error {
		all, err := tx.ServiceExports()
		for _, e := range all {
			if e.Cluster == cluster && e.Node == node {
				out = append(out, e)
			}
		}
		return err
	})
	return out, b.knobs.count(apiv1.Agent_SetExports_FullMethodName)
}
