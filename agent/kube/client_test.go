package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
)

// newAPIServer is a Client of a stand-in API server on loopback that answers each request with
// the handler routes give for its method and path.
func newAPIServer(t *testing.T, routes map[string]http.HandlerFunc) Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := routes[r.Method+" "+r.URL.Path]
		if !ok {
			t.Errorf("unexpected request %s %s", r.Method, r.URL)
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return c
}

func writeJSON(t *testing.T, w http.ResponseWriter, code int, v any) {
	t.Helper()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		t.Errorf("encode: %v", err)
	}
}

// wantQuery fails the test unless q carries every key of want with its value.
func wantQuery(t *testing.T, q url.Values, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := q.Get(k); got != v {
			t.Errorf("query %s = %q, want %q (query %s)", k, got, v, q.Encode())
		}
	}
}

func TestClientListsCoreObjectsWithTheInformersOptions(t *testing.T) {
	c := newAPIServer(t, map[string]http.HandlerFunc{
		"GET /api/v1/nodes": func(w http.ResponseWriter, r *http.Request) {
			wantQuery(t, r.URL.Query(), map[string]string{"fieldSelector": "metadata.name=gw1", "resourceVersion": "0"})
			writeJSON(t, w, http.StatusOK, &corev1.NodeList{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"},
				ListMeta: metav1.ListMeta{ResourceVersion: "42"},
				Items:    []corev1.Node{*node("gw1", corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.5"})},
			})
		},
	})
	obj, err := c.Nodes().List(context.Background(), metav1.ListOptions{FieldSelector: "metadata.name=gw1", ResourceVersion: "0"})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	nl, ok := obj.(*corev1.NodeList)
	if !ok || nl.ResourceVersion != "42" || len(nl.Items) != 1 || AddressesOf(&nl.Items[0]).Private.String() != "10.0.0.5" {
		t.Fatalf("List = %#v, want the typed NodeList of gw1 at resourceVersion 42", obj)
	}
}

func TestClientWatchesEndpointSlicesFromAResourceVersionWithBookmarks(t *testing.T) {
	c := newAPIServer(t, map[string]http.HandlerFunc{
		"GET /apis/discovery.k8s.io/v1/endpointslices": func(w http.ResponseWriter, r *http.Request) {
			wantQuery(t, r.URL.Query(), map[string]string{"watch": "true", "resourceVersion": "7",
				"allowWatchBookmarks": "true", "labelSelector": discoveryv1.LabelServiceName, "timeoutSeconds": "60"})
			w.Header().Set("Content-Type", "application/json")
			slice := epSlice("shop", "web", "web-1")
			slice.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
			enc := json.NewEncoder(w)
			for _, ev := range []map[string]any{
				{"type": "ADDED", "object": slice},
				{"type": "BOOKMARK", "object": map[string]any{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": map[string]any{"resourceVersion": "9"}}},
			} {
				if err := enc.Encode(ev); err != nil {
					t.Errorf("encode: %v", err)
				}
			}
		},
	})
	timeout := int64(60)
	wi, err := c.EndpointSlices().Watch(context.Background(), metav1.ListOptions{ResourceVersion: "7", AllowWatchBookmarks: true,
		LabelSelector: discoveryv1.LabelServiceName, TimeoutSeconds: &timeout})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer wi.Stop()
	next := func() watch.Event {
		t.Helper()
		select {
		case ev := <-wi.ResultChan():
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("no watch event within 5s")
		}
		return watch.Event{}
	}
	if ev := next(); ev.Type != watch.Added {
		t.Fatalf("first event %v %+v, want ADDED", ev.Type, ev.Object)
	} else if s, ok := ev.Object.(*discoveryv1.EndpointSlice); !ok || s.Name != "web-1" || s.Labels[discoveryv1.LabelServiceName] != "web" {
		t.Fatalf("first event's object %#v, want the typed EndpointSlice web-1", ev.Object)
	}
	if ev := next(); ev.Type != watch.Bookmark {
		t.Fatalf("second event %v, want BOOKMARK", ev.Type)
	} else if s, ok := ev.Object.(*discoveryv1.EndpointSlice); !ok || s.ResourceVersion != "9" {
		t.Fatalf("bookmark's object %#v, want an EndpointSlice at resourceVersion 9", ev.Object)
	}
}

func TestClientWritesTheServiceExportStatusSubresource(t *testing.T) {
	const path = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/shop/serviceexports/web/status"
	var (
		mu       sync.Mutex // the handler runs on the server's goroutine
		got      mcsv1a1.ServiceExport
		conflict bool
	)
	c := newAPIServer(t, map[string]http.HandlerFunc{
		"PUT " + path: func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if conflict {
				writeJSON(t, w, http.StatusConflict, &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
					Status: metav1.StatusFailure, Reason: metav1.StatusReasonConflict, Code: http.StatusConflict, Message: "the object has been modified"})
				return
			}
			if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
				t.Errorf("decode the body: %v", err)
			}
			writeJSON(t, w, http.StatusOK, &got)
		},
	})
	se := withCondition(svcExport("shop", "web"), validCondition(Validity{Valid: false, Reason: ReasonNoService, Message: "no Service"}, 3))
	if err := c.UpdateServiceExportStatus(context.Background(), se); err != nil {
		t.Fatalf("UpdateServiceExportStatus: %v", err)
	}
	mu.Lock()
	if got.APIVersion != "multicluster.x-k8s.io/v1alpha1" || got.Kind != "ServiceExport" || got.Name != "web" ||
		len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Reason != ReasonNoService || got.Status.Conditions[0].ObservedGeneration != 3 {
		t.Fatalf("the API server got %+v, want the ServiceExport web with its Valid condition", got)
	}
	conflict = true
	mu.Unlock()
	if err := c.UpdateServiceExportStatus(context.Background(), se); !apierrors.IsConflict(err) {
		t.Fatalf("UpdateServiceExportStatus on a conflict = %v, want an error apierrors.IsConflict knows", err)
	}
}
