package kubestatus

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
)

// ClusterLinkGVR is the ClusterLink resource (deploy/crds: cluster-scoped, cablemesh.io/v1alpha1),
// one per remote cluster, named after it.
var ClusterLinkGVR = schema.GroupVersionResource{Group: "cablemesh.io", Version: "v1alpha1", Resource: "clusterlinks"}

// ClusterLinkKind is the ClusterLink's kind.
const ClusterLinkKind = "ClusterLink"

// API is what the writer reads and writes on the API server. Errors are the API server's, so
// apierrors.IsNotFound, IsConflict and IsAlreadyExists work on them.
type API interface {
	// ListClusterLinks lists the ClusterLinks whose labels match selector.
	ListClusterLinks(ctx context.Context, selector string) ([]unstructured.Unstructured, error)
	CreateClusterLink(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error)
	// UpdateClusterLink replaces u (its resourceVersion guards against a concurrent write).
	UpdateClusterLink(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error)
	DeleteClusterLink(ctx context.Context, name string) error

	ListPolicies(ctx context.Context) ([]unstructured.Unstructured, error)
	// UpdatePolicyStatus writes u's status (the status subresource).
	UpdatePolicyStatus(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error)
}

// dynamicAPI is the API over client-go's dynamic client (which the agent already links for its
// ClusterConnectionPolicy source: no typed clientset, no further API group).
type dynamicAPI struct{ c dynamic.Interface }

// NewAPI is the API that c reaches.
func NewAPI(c dynamic.Interface) API { return dynamicAPI{c} }

func (a dynamicAPI) ListClusterLinks(ctx context.Context, selector string) ([]unstructured.Unstructured, error) {
	l, err := a.c.Resource(ClusterLinkGVR).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func (a dynamicAPI) CreateClusterLink(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return a.c.Resource(ClusterLinkGVR).Create(ctx, u, metav1.CreateOptions{})
}

func (a dynamicAPI) UpdateClusterLink(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return a.c.Resource(ClusterLinkGVR).Update(ctx, u, metav1.UpdateOptions{})
}

func (a dynamicAPI) DeleteClusterLink(ctx context.Context, name string) error {
	return a.c.Resource(ClusterLinkGVR).Delete(ctx, name, metav1.DeleteOptions{})
}

func (a dynamicAPI) ListPolicies(ctx context.Context) ([]unstructured.Unstructured, error) {
	l, err := a.c.Resource(clusterpolicy.GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func (a dynamicAPI) UpdatePolicyStatus(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return a.c.Resource(clusterpolicy.GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{})
}
