package cablectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

var linksNow = time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)

// nodeReport is one gateway's report; each link is "remote:state:driver", reported age ago.
func nodeReport(cluster string, age time.Duration, links ...string) *apiv1.NodeLinkReports {
	nr := &apiv1.NodeLinkReports{Cluster: cluster, Node: cluster + "-gw", AgentVersion: "v1", ReportedAt: timestamppb.New(linksNow.Add(-age))}
	for _, l := range links {
		f := strings.Split(l, ":")
		nr.Links = append(nr.Links, &apiv1.LinkReport{RemoteCluster: f[0], State: f[1], Driver: f[2], Alive: f[1] == "connected",
			HasLatency: true, LatencyP50Ms: 1, LatencyP95Ms: 2, LatencyP99Ms: 3, ReportedAt: timestamppb.New(linksNow.Add(-age))})
	}
	return nr
}

func reports(nodes ...*apiv1.NodeLinkReports) *apiv1.ListLinkReportsResponse {
	return &apiv1.ListLinkReportsResponse{Nodes: nodes, StaleAfterMs: (3 * time.Minute).Milliseconds(), BrokerTime: timestamppb.New(linksNow)}
}

func TestPairLinksJudgesEachPair(t *testing.T) {
	for _, tc := range []struct {
		name               string
		resp               *apiv1.ListLinkReportsResponse
		agree, stale, live bool
	}{
		{"both ends connected on the same driver agree", reports(
			nodeReport("a", time.Second, "b:connected:wireguard"), nodeReport("b", time.Second, "a:connected:wireguard")), true, false, true},
		{"connected against error disagrees", reports(
			nodeReport("a", time.Second, "b:connected:wireguard"), nodeReport("b", time.Second, "a:error:wireguard")), false, false, false},
		{"two drivers disagree", reports(
			nodeReport("a", time.Second, "b:connected:wireguard"), nodeReport("b", time.Second, "a:connected:vxlan")), false, false, true},
		{"one end missing does not agree", reports(
			nodeReport("a", time.Second, "b:connected:wireguard")), false, false, false},
		{"an old report is stale", reports(
			nodeReport("a", time.Second, "b:connected:wireguard"), nodeReport("b", 4*time.Minute, "a:connected:wireguard")), true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pairs := PairLinks(tc.resp)
			if len(pairs) != 1 {
				t.Fatalf("%d pairs, want 1: %+v", len(pairs), pairs)
			}
			p := pairs[0]
			if p.Clusters != [2]string{"a", "b"} {
				t.Fatalf("clusters %v, want [a b]", p.Clusters)
			}
			if p.Agree != tc.agree || p.Stale != tc.stale || p.Alive != tc.live {
				t.Fatalf("agree=%v stale=%v alive=%v, want %v %v %v", p.Agree, p.Stale, p.Alive, tc.agree, tc.stale, tc.live)
			}
		})
	}
}

func TestPairLinksMakesOneItemPerPairWithBothEnds(t *testing.T) {
	pairs := PairLinks(reports(
		nodeReport("c", time.Second, "a:connected:wireguard", "b:connected:wireguard"),
		nodeReport("a", 2*time.Second, "b:connected:wireguard", "c:connected:wireguard"),
		nodeReport("b", 3*time.Second, "a:connected:wireguard", "c:connected:wireguard")))
	var got []string
	for _, p := range pairs {
		got = append(got, p.Clusters[0]+"-"+p.Clusters[1])
		if len(p.Ends) != 2 || p.Ends[0].Cluster != p.Clusters[0] || p.Ends[1].Cluster != p.Clusters[1] {
			t.Fatalf("pair %v: ends %+v, want one of each cluster in order", p.Clusters, p.Ends)
		}
	}
	if want := []string{"a-b", "a-c", "b-c"}; !slices.Equal(got, want) {
		t.Fatalf("pairs %v, want %v", got, want)
	}
	if pairs[0].Age != 3*time.Second {
		t.Fatalf("age of a-b %v, want the older end's 3s", pairs[0].Age)
	}
}

// The JSON keys are a contract: exactly these.
func TestLinksAllJSONKeys(t *testing.T) {
	var buf bytes.Buffer
	all := LinksAll{Items: PairLinks(reports(nodeReport("a", time.Second, "b:connected:wireguard"), nodeReport("b", time.Second, "a:connected:wireguard")))}
	if err := printLinksAll(&buf, "json", all); err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	item := doc["items"][0]
	if got, want := sortedKeys(item), []string{"agree", "clusters", "ends", "stale"}; !slices.Equal(got, want) {
		t.Fatalf("item keys %v, want %v", got, want)
	}
	var ends []map[string]json.RawMessage
	if err := json.Unmarshal(item["ends"], &ends); err != nil {
		t.Fatal(err)
	}
	want := []string{"agentVersion", "cluster", "driver", "lastHandshake", "latencyP50Ms", "latencyP95Ms", "latencyP99Ms", "node", "policy", "reportedAt", "state"}
	if got := sortedKeys(ends[0]); !slices.Equal(got, want) {
		t.Fatalf("end keys %v, want %v", got, want)
	}
}

func sortedKeys(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestLinksAllTableMarksDisagreementAndStaleness(t *testing.T) {
	var buf bytes.Buffer
	all := LinksAll{Items: PairLinks(reports(
		nodeReport("a", time.Second, "b:connected:wireguard", "c:connected:wireguard"),
		nodeReport("b", time.Second, "a:error:wireguard"),
		nodeReport("c", 5*time.Minute, "a:connected:wireguard")))}
	if err := printLinksAll(&buf, "table", all); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want a header and two pairs:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[1], "DISAGREE") || strings.Contains(lines[1], "STALE") || !strings.Contains(lines[1], "error") {
		t.Fatalf("a-b row %q: want DISAGREE, not STALE", lines[1])
	}
	if !strings.Contains(lines[2], "STALE") || !strings.Contains(lines[2], "300s") && !strings.Contains(lines[2], "5m") {
		t.Fatalf("a-c row %q: want STALE and the age 5m", lines[2])
	}
}

type unimplementedAdmin struct{ apiv1.AdminClient }

func (unimplementedAdmin) ListLinkReports(context.Context, *apiv1.ListLinkReportsRequest, ...grpc.CallOption) (*apiv1.ListLinkReportsResponse, error) {
	return nil, status.Error(codes.Unimplemented, "unknown method ListLinkReports")
}

func TestFetchLinksAllSaysWhenTheBrokerIsTooOld(t *testing.T) {
	_, err := FetchLinksAll(context.Background(), unimplementedAdmin{})
	if !errors.Is(err, ErrLinkReportsUnsupported) {
		t.Fatalf("err = %v, want ErrLinkReportsUnsupported", err)
	}
}

// pagedAdmin answers ListLinkReports in pages of one node.
type pagedAdmin struct {
	apiv1.AdminClient
	nodes []*apiv1.NodeLinkReports
	calls int
}

func (p *pagedAdmin) ListLinkReports(_ context.Context, req *apiv1.ListLinkReportsRequest, _ ...grpc.CallOption) (*apiv1.ListLinkReportsResponse, error) {
	p.calls++
	i := 0
	for i < len(p.nodes) && p.nodes[i].Cluster <= req.PageToken {
		i++
	}
	resp := reports(p.nodes[i])
	if i+1 < len(p.nodes) {
		resp.NextPageToken = p.nodes[i].Cluster
	}
	return resp, nil
}

func TestFetchLinksAllReadsEveryPage(t *testing.T) {
	admin := &pagedAdmin{nodes: []*apiv1.NodeLinkReports{nodeReport("a", time.Second, "b:connected:wireguard"),
		nodeReport("b", time.Second, "a:connected:wireguard", "c:connected:wireguard"), nodeReport("c", time.Second, "b:connected:wireguard")}}
	all, err := FetchLinksAll(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if admin.calls != 3 || len(all.Items) != 2 || !all.Items[0].Agree || !all.Items[1].Agree {
		t.Fatalf("%d calls, items %+v: want 3 pages making a-b and b-c, both agreeing", admin.calls, all.Items)
	}
}
