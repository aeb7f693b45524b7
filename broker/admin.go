package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
)

// adminService serves the Admin API: each handler reads the store, lets admission decide, and
// writes what it decided.
type adminService struct {
	apiv1.UnimplementedAdminServer
	s *Server
}

func (a *adminService) ListClusters(ctx context.Context, _ *apiv1.ListClustersRequest) (*apiv1.ListClustersResponse, error) {
	resp := &apiv1.ListClustersResponse{}
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		if resp.Clusters, err = tx.Clusters(); err != nil {
			return err
		}
		if resp.Endpoints, err = tx.Endpoints(); err != nil {
			return err
		}
		resp.Revision = tx.Revision()
		return nil
	})
	if err != nil {
		return nil, rpcError("list clusters", err)
	}
	sort.Slice(resp.Clusters, func(i, j int) bool { return resp.Clusters[i].Name < resp.Clusters[j].Name })
	return resp, nil
}

func (a *adminService) LabelCluster(ctx context.Context, req *apiv1.LabelClusterRequest) (*apiv1.Cluster, error) {
	change, err := admission.ParseLabelChange(req)
	if err != nil {
		return nil, rpcError("label cluster", err)
	}
	var out *apiv1.Cluster
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(change.Name)
		if err != nil {
			return err
		}
		c, changed, err := admission.Relabel(c, change)
		if err != nil || !changed {
			out = c
			return err // nothing changes, so no revision either
		}
		if err := tx.PutCluster(c); err != nil {
			return err
		}
		out, err = tx.Cluster(change.Name)
		return err
	})
	if err != nil {
		return nil, rpcError("label cluster", err)
	}
	a.s.log.Info("cluster labels changed", "cluster", out.Name, "labels", out.Labels)
	return out, nil
}

func (a *adminService) RemoveCluster(ctx context.Context, req *apiv1.RemoveClusterRequest) (*apiv1.RemoveClusterResponse, error) {
	if err := admission.CheckClusterName("name", req.Name); err != nil {
		return nil, rpcError("remove cluster", err)
	}
	var (
		removed      *apiv1.Cluster
		removal      admission.ClusterRemoval
		released     []*apiv1.ServiceVIP
		releasedMesh []string // the claims of its nodes' mesh addresses
	)
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(req.Name)
		if err != nil {
			return err
		}
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		exports, err := tx.ServiceExports()
		if err != nil {
			return err
		}
		vips, err := tx.ServiceVIPs()
		if err != nil {
			return err
		}
		if removal, err = admission.RemoveCluster(req.Name, c, eps, exports); err != nil {
			return err
		}
		for _, e := range removal.Endpoints {
			if err := tx.DeleteEndpoint(e.Cluster, e.Node); err != nil {
				return err
			}
		}
		for _, e := range removal.Exports {
			if err := tx.DeleteServiceExport(e.Cluster, e.Node, e.Namespace, e.Name); err != nil {
				return err
			}
		}
		released = admission.ReleaseVIPs(admission.ExportsWithout(exports, req.Name), vips)
		if err := a.s.applyVIPPlan(tx, admission.VIPPlan{Release: released}); err != nil {
			return err
		}
		// Its nodes' certificate records and its tokens' records go with it.
		nodes, err := tx.NodeCertificates()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Cluster == req.Name {
				if err := tx.DeleteNodeCertificate(n.Cluster, n.Node); err != nil {
					return err
				}
			}
		}
		toks, err := tx.JoinTokens()
		if err != nil {
			return err
		}
		for _, t := range toks {
			if t.Cluster == req.Name {
				if err := tx.DeleteJoinToken(t.Nonce); err != nil {
					return err
				}
			}
		}
		// Its nodes' mesh addresses are free for the next cluster.
		if releasedMesh, err = releaseClusterMeshClaims(tx, req.Name); err != nil {
			return err
		}
		removed = c
		return tx.DeleteCluster(req.Name)
	})
	if err != nil {
		return nil, rpcError("remove cluster", err)
	}
	a.s.log.Info("cluster removed", "cluster", req.Name, "id", removed.Id, "endpoints", len(removal.Endpoints), "exports", len(removal.Exports))
	a.s.logVIPPlan(admission.VIPPlan{Release: released})
	a.s.meshHint.released(releasedMesh)
	return &apiv1.RemoveClusterResponse{Cluster: removed}, nil
}

func (a *adminService) CreateJoinToken(ctx context.Context, req *apiv1.CreateJoinTokenRequest) (*apiv1.CreateJoinTokenResponse, error) {
	creq, err := admission.ParseClusterRequest(req)
	if err != nil {
		return nil, rpcError("create join token", err)
	}
	validFor, err := admission.TokenValidity(req.ValidForSeconds, DefaultTokenValidity, MaxTokenValidity)
	if err != nil {
		return nil, rpcError("create join token", err)
	}
	maxNodes, err := admission.TokenNodes(req.MaxNodes)
	if err != nil {
		return nil, rpcError("create join token", err)
	}
	self, err := a.s.selfAddresses()
	if err != nil {
		return nil, rpcError("create join token: read the broker's own addresses", err)
	}
	now := a.s.cfg.Now()
	uid := newUID()
	nonce := newUID()
	expires := now.Add(validFor)
	var (
		cluster *apiv1.Cluster
		created bool
	)
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		all, err := tx.Clusters()
		if err != nil {
			return err
		}
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		if cluster, created, err = admission.AdmitCluster(creq, all, now, uid); err != nil {
			return err
		}
		if created {
			if err := admission.CheckReachable(creq, self, eps); err != nil {
				return err
			}
			if err := admission.CheckMeshRange(creq, a.s.cfg.MeshAddressRange); err != nil {
				return err
			}
			if err := tx.PutCluster(cluster); err != nil {
				return err
			}
			if cluster, err = tx.Cluster(creq.Name); err != nil {
				return err
			}
		}
		// The token's record: its node count, kept with its nonce. Records of expired tokens go.
		toks, err := tx.JoinTokens()
		if err != nil {
			return err
		}
		for _, n := range admission.ExpiredTokens(toks, now) {
			if err := tx.DeleteJoinToken(n); err != nil {
				return err
			}
		}
		return tx.PutJoinToken(admission.NewTokenRecord(nonce, cluster, maxNodes, expires, now))
	})
	if err != nil {
		return nil, rpcError("create join token", err)
	}
	if created {
		a.s.log.Info("cluster created", "cluster", cluster.Name, "id", cluster.Id, "podCIDRs", cluster.PodCidrs, "serviceCIDRs", cluster.ServiceCidrs, "gatewayMode", cluster.GatewayMode)
	}
	p := a.s.currentPKI()
	token, err := jointoken.Sign(jointoken.Claims{
		Cluster:    cluster.Name,
		ClusterUID: cluster.Uid,
		Expires:    expires,
		CAHash:     p.CAHash(),
		Nonce:      nonce,
	}, p.TokenKey)
	if err != nil {
		return nil, rpcError("sign join token", err)
	}
	a.s.log.Info("join token issued", "cluster", cluster.Name, "expires", expires.UTC().Format(time.RFC3339), "maxNodes", maxNodes)
	return &apiv1.CreateJoinTokenResponse{Token: token, Cluster: cluster, Expires: timestamppb.New(expires), MaxNodes: maxNodes}, nil
}

// newUID returns a random 128-bit id in UUID form.
func newUID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
