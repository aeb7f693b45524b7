package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/api/validation"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/registry"
	"github.com/cablemesh/cablemesh/broker/store"
)

type adminService struct {
	apiv1.UnimplementedAdminServer
	s *Server
}

func invalid(err error) error { return status.Error(codes.InvalidArgument, err.Error()) }

// storeErr passes status errors from inside a transaction through and wraps anything else.
func storeErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Internal, "%s: %v", op, err)
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
		return nil, storeErr("list clusters", err)
	}
	sort.Slice(resp.Clusters, func(i, j int) bool { return resp.Clusters[i].Name < resp.Clusters[j].Name })
	return resp, nil
}

func (a *adminService) LabelCluster(ctx context.Context, req *apiv1.LabelClusterRequest) (*apiv1.Cluster, error) {
	if err := validation.ValidateClusterName(req.Name); err != nil {
		return nil, invalid(err)
	}
	if err := validation.ValidateLabels(req.Set); err != nil {
		return nil, invalid(err)
	}
	for _, k := range req.Remove {
		if err := validation.ValidateLabelKey(k); err != nil {
			return nil, invalid(err)
		}
		if _, ok := req.Set[k]; ok {
			return nil, invalid(fmt.Errorf("label %q is both set and removed", k))
		}
	}
	var out *apiv1.Cluster
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(req.Name)
		if err != nil {
			return err
		}
		if c == nil {
			return status.Errorf(codes.NotFound, "cluster %q not found", req.Name)
		}
		labels := maps.Clone(c.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, req.Set)
		for _, k := range req.Remove {
			delete(labels, k)
		}
		if maps.Equal(labels, c.Labels) || (len(labels) == 0 && len(c.Labels) == 0) {
			out = c
			return nil // nothing changes, so no revision either
		}
		c.Labels = labels
		if err := tx.PutCluster(c); err != nil {
			return err
		}
		out, err = tx.Cluster(req.Name)
		return err
	})
	if err != nil {
		return nil, storeErr("label cluster", err)
	}
	a.s.log.Info("cluster labels changed", "cluster", req.Name, "labels", out.Labels)
	return out, nil
}

func (a *adminService) RemoveCluster(ctx context.Context, req *apiv1.RemoveClusterRequest) (*apiv1.RemoveClusterResponse, error) {
	if err := validation.ValidateClusterName(req.Name); err != nil {
		return nil, invalid(err)
	}
	var removed *apiv1.Cluster
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(req.Name)
		if err != nil {
			return err
		}
		if c == nil {
			return status.Errorf(codes.NotFound, "cluster %q not found", req.Name)
		}
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		for _, e := range eps {
			if e.Cluster == req.Name {
				if err := tx.DeleteEndpoint(e.Cluster, e.Node); err != nil {
					return err
				}
			}
		}
		removed = c
		return tx.DeleteCluster(req.Name)
	})
	if err != nil {
		return nil, storeErr("remove cluster", err)
	}
	a.s.log.Info("cluster removed", "cluster", req.Name, "id", removed.Id)
	return &apiv1.RemoveClusterResponse{Cluster: removed}, nil
}

func (a *adminService) CreateJoinToken(ctx context.Context, req *apiv1.CreateJoinTokenRequest) (*apiv1.CreateJoinTokenResponse, error) {
	if err := validation.ValidateClusterName(req.Cluster); err != nil {
		return nil, invalid(err)
	}
	pods, err := validation.ParseCIDRs("pod CIDR", req.PodCidrs)
	if err != nil {
		return nil, invalid(err)
	}
	svcs, err := validation.ParseCIDRs("service CIDR", req.ServiceCidrs)
	if err != nil {
		return nil, invalid(err)
	}
	if err := validation.ValidateLabels(req.Labels); err != nil {
		return nil, invalid(err)
	}
	validFor := DefaultTokenValidity
	switch {
	case req.ValidForSeconds < 0:
		return nil, invalid(fmt.Errorf("valid_for_seconds %d is negative", req.ValidForSeconds))
	case req.ValidForSeconds > int64(MaxTokenValidity/time.Second):
		return nil, invalid(fmt.Errorf("valid_for_seconds %d is more than the maximum %s", req.ValidForSeconds, MaxTokenValidity))
	case req.ValidForSeconds > 0:
		validFor = time.Duration(req.ValidForSeconds) * time.Second
	}

	now := a.s.cfg.Now()
	var cluster *apiv1.Cluster
	created := false
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		created = false
		existing, err := tx.Cluster(req.Cluster)
		if err != nil {
			return err
		}
		if existing != nil {
			cluster = existing
			return checkSameCluster(existing, pods, svcs, req.Labels)
		}
		if len(pods) == 0 {
			return status.Errorf(codes.InvalidArgument, "cluster %q does not exist yet: its pod CIDRs are required to create it (--pod-cidr)", req.Cluster)
		}
		all, err := tx.Clusters()
		if err != nil {
			return err
		}
		used := map[uint32]bool{}
		var others []registry.ClusterCIDRs
		for _, c := range all {
			used[c.Id] = true
			others = append(others, registry.ClusterCIDRs{Name: c.Name, PodCIDRs: mustPrefixes(c.PodCidrs), ServiceCIDRs: mustPrefixes(c.ServiceCidrs)})
		}
		if err := registry.CheckOverlap(registry.ClusterCIDRs{Name: req.Cluster, PodCIDRs: pods, ServiceCIDRs: svcs}, others); err != nil {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		id, err := registry.AllocateID(used)
		if err != nil {
			return status.Errorf(codes.ResourceExhausted, "cannot add cluster %q: %v", req.Cluster, err)
		}
		c := &apiv1.Cluster{
			Name:         req.Cluster,
			Id:           id,
			Labels:       req.Labels,
			PodCidrs:     validation.Strings(pods),
			ServiceCidrs: validation.Strings(svcs),
			JoinedAt:     timestamppb.New(now),
			Uid:          newUID(),
		}
		if err := tx.PutCluster(c); err != nil {
			return err
		}
		created = true
		cluster, err = tx.Cluster(req.Cluster)
		return err
	})
	if err != nil {
		return nil, storeErr("create join token", err)
	}
	if created {
		a.s.log.Info("cluster created", "cluster", cluster.Name, "id", cluster.Id, "pod_cidrs", cluster.PodCidrs, "service_cidrs", cluster.ServiceCidrs)
	}
	expires := now.Add(validFor)
	token, err := jointoken.Sign(jointoken.Claims{
		Cluster:    cluster.Name,
		ClusterUID: cluster.Uid,
		Expires:    expires,
		CAHash:     a.s.pki.CAHash(),
		Nonce:      newUID(),
	}, a.s.pki.TokenKey)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "sign join token: %v", err)
	}
	a.s.log.Info("join token issued", "cluster", cluster.Name, "expires", expires.UTC().Format(time.RFC3339))
	return &apiv1.CreateJoinTokenResponse{Token: token, Cluster: cluster, Expires: timestamppb.New(expires)}, nil
}

// checkSameCluster refuses a join-token request for an existing cluster that gives different
// CIDRs or labels: names are unique in the mesh, so a request that disagrees is most likely a
// second cluster under a name already taken.
func checkSameCluster(c *apiv1.Cluster, pods, svcs []netip.Prefix, labels map[string]string) error {
	if len(pods) > 0 && !validation.SameCIDRs(pods, mustPrefixes(c.PodCidrs)) {
		return status.Errorf(codes.AlreadyExists, "cluster %q already exists with pod CIDRs [%s], not [%s]: cluster names are unique in the mesh; to add a node to it, give the same --pod-cidr or none",
			c.Name, strings.Join(c.PodCidrs, ","), strings.Join(validation.Strings(pods), ","))
	}
	if len(svcs) > 0 && !validation.SameCIDRs(svcs, mustPrefixes(c.ServiceCidrs)) {
		return status.Errorf(codes.AlreadyExists, "cluster %q already exists with service CIDRs [%s], not [%s]: cluster names are unique in the mesh; to add a node to it, give the same --service-cidr or none",
			c.Name, strings.Join(c.ServiceCidrs, ","), strings.Join(validation.Strings(svcs), ","))
	}
	keys := slices.Sorted(maps.Keys(labels))
	for _, k := range keys {
		old, ok := c.Labels[k]
		if !ok {
			return status.Errorf(codes.AlreadyExists, "cluster %q already exists without label %q (asked for %q=%q): change labels with `cablectl cluster label`", c.Name, k, k, labels[k])
		}
		if old != labels[k] {
			return status.Errorf(codes.AlreadyExists, "cluster %q already exists and its label %q is %q, not %q: change labels with `cablectl cluster label`", c.Name, k, old, labels[k])
		}
	}
	return nil
}

// mustPrefixes parses CIDRs the broker stored itself (validated on the way in).
func mustPrefixes(ss []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
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
