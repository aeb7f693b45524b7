package kube

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// RESTGroups are REST clients of one API server, one per API group version, sharing one HTTP
// client and a scheme that holds only the types its caller registers (not client-go's
// clientset, whose scheme registers every API group and so links every one into the agent).
type RESTGroups struct {
	// Params encodes ListOptions and the other option types as query parameters.
	Params  runtime.ParameterCodec
	clients map[schema.GroupVersion]*rest.RESTClient
}

// NewRESTGroups builds the clients of gvs on the API server rc reaches, with a scheme of the
// types adds register.
func NewRESTGroups(rc *rest.Config, adds []func(*runtime.Scheme) error, gvs ...schema.GroupVersion) (*RESTGroups, error) {
	scheme := runtime.NewScheme()
	for _, add := range adds {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("client scheme: %w", err)
		}
	}
	// ListOptions and the other option types encode as query parameters of any version.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	codecs := serializer.NewCodecFactory(scheme)
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("HTTP client: %w", err)
	}
	g := &RESTGroups{Params: runtime.NewParameterCodec(scheme), clients: map[schema.GroupVersion]*rest.RESTClient{}}
	for _, gv := range gvs {
		cfg := rest.CopyConfig(rc)
		cfg.APIPath = "/apis"
		if gv.Group == "" {
			cfg.APIPath = "/api" // the core group
		}
		cfg.GroupVersion = &gv
		cfg.NegotiatedSerializer = codecs.WithoutConversion()
		if cfg.UserAgent == "" {
			cfg.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		c, err := rest.RESTClientForConfigAndClient(cfg, hc)
		if err != nil {
			return nil, fmt.Errorf("client of %s: %w", gv, err)
		}
		g.clients[gv] = c
	}
	return g, nil
}

// For is the client of gv (one NewRESTGroups was given).
func (g *RESTGroups) For(gv schema.GroupVersion) *rest.RESTClient { return g.clients[gv] }
