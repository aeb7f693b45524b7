package brokerstate

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func clusterEv(name string, id uint32, rev uint64) *apiv1.Event {
	return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "cluster", Key: name, Revision: rev,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: &apiv1.Cluster{Name: name, Id: id, PodCidrs: []string{"10.1.0.0/16"}}}}}
}

func endpointEv(cluster, node string, rev uint64) *apiv1.Event {
	return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "endpoint", Key: cluster + "/" + node, Revision: rev,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: &apiv1.Endpoint{Cluster: cluster, Node: node, PrivateIp: "10.0.0.1"}}}}
}

func TestApply(t *testing.T) {
	s := New()
	if err := s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: 5, Events: []*apiv1.Event{
		clusterEv("east", 1, 2), clusterEv("west", 2, 3), endpointEv("west", "w1", 5),
	}}); err != nil {
		t.Fatal(err)
	}
	if s.Revision != 5 || len(s.Clusters) != 2 || s.Endpoints["west/w1"] == nil {
		t.Fatalf("after snapshot: %+v", s)
	}

	t.Run("a delta deletes one endpoint and moves the revision", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Revision: 6, Events: []*apiv1.Event{{Type: apiv1.Event_DELETE, Kind: "endpoint", Key: "west/w1", Revision: 6}}})
		if err != nil || s.Revision != 6 || len(s.Endpoints) != 0 || len(s.Clusters) != 2 {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
	t.Run("a malformed delta changes nothing", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Revision: 9, Events: []*apiv1.Event{
			clusterEv("north", 3, 7), {Type: apiv1.Event_UPSERT, Kind: "cluster", Key: "x", Revision: 9},
		}})
		if err == nil || s.Revision != 6 || s.Clusters["north"] != nil {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
	t.Run("a snapshot replaces everything", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: 10, Events: []*apiv1.Event{clusterEv("south", 4, 10)}})
		if err != nil || s.Revision != 10 || len(s.Clusters) != 1 || s.Clusters["south"] == nil {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
	t.Run("unknown kinds are ignored", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Revision: 11, Events: []*apiv1.Event{{Type: apiv1.Event_UPSERT, Kind: "export", Key: "p"}}})
		if err != nil || s.Revision != 11 {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
	t.Run("a policy is stored without its admin status and deleted by name", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Revision: 12, Events: []*apiv1.Event{policyEv("p", 12)}})
		if err != nil || s.Policies["p"] == nil || !s.Policies["p"].GetIsDefault() || s.Policies["p"].GetStatusJson() != nil || string(s.Policies["p"].GetJson()) != `{"x":1}` {
			t.Fatalf("err %v policies %+v", err, s.Policies)
		}
		err = s.Apply(&apiv1.WatchResponse{Revision: 13, Events: []*apiv1.Event{{Type: apiv1.Event_DELETE, Kind: "policy", Key: "p", Revision: 13}}})
		if err != nil || len(s.Policies) != 0 {
			t.Fatalf("err %v policies %+v", err, s.Policies)
		}
	})
	t.Run("a policy upsert without a resource is malformed", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Revision: 14, Events: []*apiv1.Event{{Type: apiv1.Event_UPSERT, Kind: "policy", Key: "q"}}})
		if err == nil || s.Revision != 13 {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
}

func policyEv(name string, rev uint64) *apiv1.Event {
	return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "policy", Key: name, Revision: rev,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: &apiv1.Policy{Name: name, Json: []byte(`{"x":1}`), IsDefault: true, StatusJson: []byte(`{}`)}}}}
}

func TestSaveAndLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if s, err := Load(dir); s != nil || err != nil {
		t.Fatalf("Load of an empty dir = %v, %v", s, err)
	}
	s := New()
	psk := clusterEv("west", 2, 2)
	psk.GetResource().GetCluster().PairPsk = []byte("0123456789abcdef0123456789abcdef")
	_ = s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: 42, Events: []*apiv1.Event{clusterEv("east", 1, 1), psk, endpointEv("east", "e1", 42), policyEv("default", 40)}})
	if err := s.Save(dir, time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != 42 || !proto.Equal(got.Clusters["east"], s.Clusters["east"]) || !proto.Equal(got.Endpoints["east/e1"], s.Endpoints["east/e1"]) ||
		!proto.Equal(got.Policies["default"], s.Policies["default"]) || string(got.Clusters["west"].GetPairPsk()) != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("round trip: %+v", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
	fi, _ := os.Stat(filepath.Join(dir, FileName))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("Load of a corrupt cache succeeded")
	}
}

func FuzzUnmarshal(f *testing.F) {
	s := New()
	_ = s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: 3, Events: []*apiv1.Event{clusterEv("east", 1, 1), endpointEv("east", "e1", 3), policyEv("p", 2)}})
	b, _ := s.Marshal(time.Unix(0, 0))
	f.Add(b)
	f.Add([]byte(`{"clusters":[{}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Unmarshal(data)
		if err != nil {
			return
		}
		out, err := st.Marshal(time.Unix(0, 0))
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := Unmarshal(out)
		if err != nil || again.Revision != st.Revision || len(again.Clusters) != len(st.Clusters) || len(again.Endpoints) != len(st.Endpoints) || len(again.Policies) != len(st.Policies) {
			t.Fatalf("round trip changed the state: %v", err)
		}
	})
}

func imports(names ...string) *apiv1.ServiceImports {
	out := &apiv1.ServiceImports{}
	for _, n := range names {
		out.Imports = append(out.Imports, &apiv1.ServiceImport{Namespace: "shop", Name: n, Type: "ClusterSetIP", Vips: []string{"241.0.0.1"},
			Clusters: []*apiv1.ImportedCluster{{Cluster: "east", ClusterId: 1, Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.10", Ready: true}}}}})
	}
	return out
}

func TestImports(t *testing.T) {
	s := New()
	if s.HasImports {
		t.Fatal("a new state says it has imports")
	}
	t.Run("a message without imports leaves them unknown", func(t *testing.T) {
		if err := s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: 1, Events: []*apiv1.Event{clusterEv("east", 1, 1)}}); err != nil || s.HasImports {
			t.Fatalf("err %v hasImports %v", err, s.HasImports)
		}
	})
	t.Run("an empty set is known and empty", func(t *testing.T) {
		if err := s.Apply(&apiv1.WatchResponse{Revision: 2, Imports: &apiv1.ServiceImports{}}); err != nil || !s.HasImports || len(s.Imports) != 0 {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
	t.Run("imports replace the imports whole", func(t *testing.T) {
		_ = s.Apply(&apiv1.WatchResponse{Revision: 3, Imports: imports("web", "db")})
		_ = s.Apply(&apiv1.WatchResponse{Revision: 4, Imports: imports("web")})
		if len(s.Imports) != 1 || s.Imports[0].GetName() != "web" {
			t.Fatalf("imports %v", s.Imports)
		}
	})
	t.Run("a snapshot without imports keeps them", func(t *testing.T) {
		_ = s.Apply(&apiv1.WatchResponse{Snapshot: true, Revision: 5, Events: []*apiv1.Event{clusterEv("west", 2, 5)}})
		if !s.HasImports || len(s.Imports) != 1 || s.Clusters["east"] != nil {
			t.Fatalf("state %+v", s)
		}
	})
	t.Run("an import without a name is malformed and changes nothing", func(t *testing.T) {
		err := s.Apply(&apiv1.WatchResponse{Revision: 6, Imports: &apiv1.ServiceImports{Imports: []*apiv1.ServiceImport{{Namespace: "shop"}}}})
		if err == nil || s.Revision != 5 || len(s.Imports) != 1 {
			t.Fatalf("err %v state %+v", err, s)
		}
	})
	t.Run("imports survive the cache round trip", func(t *testing.T) {
		dir := t.TempDir()
		if err := s.Save(dir, time.Unix(1, 0)); err != nil {
			t.Fatal(err)
		}
		got, err := Load(dir)
		if err != nil || !got.HasImports || len(got.Imports) != 1 || !proto.Equal(got.Imports[0], s.Imports[0]) {
			t.Fatalf("err %v got %+v", err, got)
		}
		empty := New()
		_ = empty.Apply(&apiv1.WatchResponse{Revision: 1, Imports: &apiv1.ServiceImports{}})
		_ = empty.Save(dir, time.Unix(1, 0))
		if got, err := Load(dir); err != nil || !got.HasImports || got.Imports == nil || len(got.Imports) != 0 {
			t.Fatalf("an empty known set did not survive: err %v got %+v", err, got)
		}
	})
}
