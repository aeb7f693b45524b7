package admission

import (
	"errors"
	"fmt"
	"time"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// CheckJoin verifies a join request: its token is signed with tokenKey, unexpired at now and for
// the mesh CA caHash (else *CredentialError; *InvalidError when it is not a token at all), it is
// for the cluster the request names (else *ForbiddenError), and the node name is valid. Whether
// the token's cluster still exists is JoinCluster's to check.
func CheckJoin(req *apiv1.JoinRequest, tokenKey []byte, caHash string, now time.Time) (jointoken.Claims, error) {
	if n := len(req.Token); n > MaxTokenBytes {
		return jointoken.Claims{}, invalidf("token", "", "token: %d bytes, at most %d: this is not a join token", n, MaxTokenBytes)
	}
	if n := len(req.CsrPem); n > MaxCSRBytes {
		return jointoken.Claims{}, invalidf("csr_pem", "", "csr_pem: %d bytes, at most %d", n, MaxCSRBytes)
	}
	claims, err := jointoken.Verify(req.Token, tokenKey, now)
	switch {
	case errors.Is(err, jointoken.ErrMalformed):
		return claims, invalid("token", "", fmt.Errorf("join token: %w", err))
	case err != nil:
		return claims, &CredentialError{Cluster: req.Cluster, Err: fmt.Errorf("join token refused: %w", err)}
	}
	if req.Cluster == "" {
		return claims, invalidf("cluster", "", "join request: cluster is empty (the token is for cluster %q)", claims.Cluster)
	}
	if claims.Cluster != req.Cluster {
		return claims, &ForbiddenError{Caller: "join token of cluster " + claims.Cluster, Target: req.Cluster,
			Err: fmt.Errorf("join token is for cluster %q, not %q", claims.Cluster, req.Cluster)}
	}
	if claims.CAHash != caHash {
		return claims, &CredentialError{Cluster: claims.Cluster, Err: fmt.Errorf("join token names mesh CA %s, but this broker's CA is %s (if the mesh CA was rotated since the token was issued, create a new token)", claims.CAHash, caHash)}
	}
	if err := validation.ValidateNodeName(req.Node); err != nil {
		return claims, invalid("node", req.Node, err)
	}
	return claims, nil
}

// JoinCluster checks that the cluster a verified token is for is still the one it was issued for:
// c is that cluster as stored (nil when there is none). A cluster removed, or removed and
// created again, since is a *CredentialError.
func JoinCluster(claims jointoken.Claims, c *apiv1.Cluster) error {
	if c == nil || c.Uid != claims.ClusterUID {
		return &CredentialError{Cluster: claims.Cluster,
			Err: fmt.Errorf("join token is for cluster %q (uid %s), which was removed from the mesh after the token was issued; create a new token", claims.Cluster, claims.ClusterUID)}
	}
	return nil
}

// AgentCluster checks that the cluster an agent certificate names still exists with the UID the
// certificate carries: c is that cluster as stored (nil when there is none).
func AgentCluster(id pki.Identity, c *apiv1.Cluster) error {
	if c == nil || c.Uid != id.ClusterUID {
		return &CredentialError{Cluster: id.Cluster,
			Err: fmt.Errorf("the certificate of %s belongs to cluster %q (uid %s), which was removed from the mesh; join again with a new token", id, id.Cluster, id.ClusterUID)}
	}
	return nil
}

// WatcherRemoved checks the events a watch of agent id is about to deliver: once they delete the
// agent's own cluster (or bring it back under another UID), the agent's certificate is no longer
// good and its watch ends, after it has been told.
func WatcherRemoved(id pki.Identity, evs []*apiv1.Event) error {
	for _, ev := range evs {
		if ev.Kind != store.KindCluster || ev.Key != id.Cluster {
			continue
		}
		if ev.Type == apiv1.Event_DELETE || ev.GetResource().GetCluster().GetUid() != id.ClusterUID {
			return &CredentialError{Cluster: id.Cluster, Err: fmt.Errorf("cluster %q was removed from the mesh", id.Cluster)}
		}
	}
	return nil
}
