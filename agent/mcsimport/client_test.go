package mcsimport

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// TestRESTPaths checks that NewAPI's client speaks the API server's REST paths: the requests
// it makes (method, path, label selector) and how it reads an API server's NotFound answer.
func TestRESTPaths(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		line := r.Method + " " + r.URL.Path
		if s := r.URL.Query().Get("labelSelector"); s != "" {
			line += "?labelSelector=" + s
		}
		got = append(got, line)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost && r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/gone/endpointslices" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure",
				Reason: metav1.StatusReasonNotFound, Code: 404, Details: &metav1.StatusDetails{Name: "gone", Kind: "namespaces"}})
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	api, err := NewAPI(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	si := &mcsv1a1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-east"}}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "cablemesh", Name: LeaseName}}
	calls := []func() error{
		func() error { _, err := api.ListServiceImports(ctx, managedSelector); return err },
		func() error { _, err := api.CreateServiceImport(ctx, si); return err },
		func() error { _, err := api.UpdateServiceImport(ctx, si); return err },
		func() error { return api.UpdateServiceImportStatus(ctx, si) },
		func() error { return api.DeleteServiceImport(ctx, "shop", "web") },
		func() error { _, err := api.ListEndpointSlices(ctx, managedSelector); return err },
		func() error { return api.CreateEndpointSlice(ctx, es) },
		func() error { return api.UpdateEndpointSlice(ctx, es) },
		func() error { return api.DeleteEndpointSlice(ctx, "shop", "web-east") },
		func() error { _, err := api.GetLease(ctx, "cablemesh", LeaseName); return err },
		func() error { _, err := api.CreateLease(ctx, lease); return err },
		func() error { _, err := api.UpdateLease(ctx, lease); return err },
	}
	for i, call := range calls {
		if err := call(); err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	want := []string{
		"GET /apis/multicluster.x-k8s.io/v1alpha1/serviceimports?labelSelector=" + managedSelector,
		"POST /apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports",
		"PUT /apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports/web",
		"PUT /apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports/web/status",
		"DELETE /apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceimports/web",
		"GET /apis/discovery.k8s.io/v1/endpointslices?labelSelector=" + managedSelector,
		"POST /apis/discovery.k8s.io/v1/namespaces/shop/endpointslices",
		"PUT /apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-east",
		"DELETE /apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-east",
		"GET /apis/coordination.k8s.io/v1/namespaces/cablemesh/leases/" + LeaseName,
		"POST /apis/coordination.k8s.io/v1/namespaces/cablemesh/leases",
		"PUT /apis/coordination.k8s.io/v1/namespaces/cablemesh/leases/" + LeaseName,
	}
	if !slices.Equal(got, want) {
		t.Errorf("requests\n%q\nwant\n%q", got, want)
	}
	err = api.CreateEndpointSlice(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "gone", Name: "x"}})
	if !apierrors.IsNotFound(err) || !namespaceMissing(err) {
		t.Errorf("a create in a missing namespace: %v, want NotFound of the namespace", err)
	}
}
