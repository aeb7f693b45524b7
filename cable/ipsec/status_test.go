package ipsec

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// saEvent is one list-sas event as charon 5.9 sends it (the keys the driver reads).
func saEvent(name, state, established string, children map[string]any) map[string]any {
	sec := map[string]any{
		"uniqueid": "1", "version": "2", "state": state,
		"local-host": "10.0.0.1", "local-port": "4500",
		"remote-host": "10.0.0.2", "remote-port": "4500",
		"initiator": "yes",
	}
	if established != "" {
		sec["established"] = established
	}
	if children != nil {
		sec["child-sas"] = children
	}
	return map[string]any{name: sec}
}

func child(state, in, out string) map[string]any {
	return map[string]any{"name": "cbl-west", "state": state, "mode": "TUNNEL", "protocol": "ESP", "encap": "yes",
		"bytes-in": in, "packets-in": "3", "bytes-out": out, "packets-out": "3"}
}

func TestConnectionStatuses(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	info := connInfo{Cluster: "west", Node: "west-gw", Endpoint: "10.0.0.2:500", Subnets: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}, Initiator: true, LoadedAt: now.Add(-5 * time.Second)}
	old := info
	old.LoadedAt = now.Add(-5 * time.Minute)
	tests := []struct {
		name      string
		info      connInfo
		events    []map[string]any
		wantState cable.State
		wantMsg   string
		wantRx    uint64
		wantTx    uint64
		endpoint  string
		wantNoMsg bool
	}{
		// The endpoint is the configured one (remote address, IKE port 500), not the IKE_SA's
		// live 10.0.0.2:4500: charon floats IKE to the NAT-T port as soon as UDP encapsulation is
		// on (always, with encap=yes), and the agent compares Endpoint with the endpoint it wants
		// (address and published IKE port), as for every driver. Reporting the live port made it
		// see a changed endpoint and run Connect again on every resync.
		{name: "an established IKE_SA with an installed CHILD_SA is connected, with its counters and the configured endpoint",
			info: info, events: []map[string]any{saEvent("cbl-west", "ESTABLISHED", "42", map[string]any{"cbl-west-1": child("INSTALLED", "1000", "2000")})},
			wantState: cable.StateConnected, wantRx: 1000, wantTx: 2000, endpoint: "10.0.0.2:500", wantNoMsg: true},
		{name: "a peer answering from another address than configured (a NAT) keeps the configured endpoint and says so",
			info: info, events: []map[string]any{func() map[string]any {
				ev := saEvent("cbl-west", "ESTABLISHED", "42", map[string]any{"cbl-west-1": child("INSTALLED", "1", "2")})
				ev["cbl-west"].(map[string]any)["remote-host"] = "192.0.2.7"
				ev["cbl-west"].(map[string]any)["remote-port"] = "31337"
				return ev
			}()},
			wantState: cable.StateConnected, wantMsg: "IKE_SA peer is 192.0.2.7:31337, not the configured 10.0.0.2:500", wantRx: 1, wantTx: 2, endpoint: "10.0.0.2:500"},
		{name: "during a rekey the bytes of both CHILD_SAs count",
			info: info, events: []map[string]any{saEvent("cbl-west", "ESTABLISHED", "42", map[string]any{"cbl-west-1": child("REKEYED", "10", "20"), "cbl-west-2": child("INSTALLED", "1", "2")})},
			wantState: cable.StateConnected, wantRx: 11, wantTx: 22},
		{name: "no SA yet on a fresh initiator is connecting",
			info: info, wantState: cable.StateConnecting, wantMsg: "initiating IKE", endpoint: "10.0.0.2:500"},
		{name: "no SA yet on a fresh responder waits for the peer",
			info: func() connInfo { i := info; i.Initiator = false; return i }(), wantState: cable.StateConnecting, wantMsg: "waiting for the peer to initiate"},
		{name: "no SA minutes after loading is an error",
			info: old, wantState: cable.StateError, wantMsg: "no IKE_SA 5m0s after the connection was loaded"},
		{name: "an IKE_SA still connecting is connecting",
			info: info, events: []map[string]any{saEvent("cbl-west", "CONNECTING", "", nil)}, wantState: cable.StateConnecting, wantMsg: "IKE_SA CONNECTING"},
		{name: "an IKE_SA connecting for minutes is an error",
			info: old, events: []map[string]any{saEvent("cbl-west", "CONNECTING", "", nil)}, wantState: cable.StateError, wantMsg: "still CONNECTING"},
		{name: "an established IKE_SA without a CHILD_SA for a while is an error",
			info: info, events: []map[string]any{saEvent("cbl-west", "ESTABLISHED", "60", nil)}, wantState: cable.StateError, wantMsg: "no CHILD_SA installed"},
		{name: "a just established IKE_SA without a CHILD_SA yet is connecting",
			info: info, events: []map[string]any{saEvent("cbl-west", "ESTABLISHED", "1", map[string]any{"cbl-west-1": child("INSTALLING", "0", "0")})}, wantState: cable.StateConnecting, wantMsg: "CHILD_SA not installed yet"},
		{name: "a deleting IKE_SA is an error",
			info: info, events: []map[string]any{saEvent("cbl-west", "DELETING", "100", nil)}, wantState: cable.StateError, wantMsg: "IKE_SA DELETING"},
		{name: "of two IKE_SAs (a reauthentication) the usable one counts",
			info: info, events: []map[string]any{saEvent("cbl-west", "DELETING", "100", nil), saEvent("cbl-west", "ESTABLISHED", "2", map[string]any{"x": child("INSTALLED", "5", "6")})},
			wantState: cable.StateConnected, wantRx: 5, wantTx: 6},
		{name: "garbage values count as absent",
			info: info, events: []map[string]any{{"cbl-west": "not a section"}, saEvent("cbl-west", "ESTABLISHED", "x", map[string]any{"y": child("INSTALLED", "-1", "z")})},
			wantState: cable.StateConnected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := connectionStatuses(map[string]connInfo{"cbl-west": tt.info}, nil, parseSAs(tt.events), now, 1400)
			if len(got) != 1 {
				t.Fatalf("got %d statuses, want 1: %+v", len(got), got)
			}
			s := got[0]
			if s.Cluster != "west" || s.Node != "west-gw" || s.MTU != 1400 || len(s.Subnets) != 1 {
				t.Errorf("status %+v", s)
			}
			if s.State != tt.wantState || !strings.Contains(s.Message, tt.wantMsg) {
				t.Errorf("state %s %q, want %s containing %q", s.State, s.Message, tt.wantState, tt.wantMsg)
			}
			if s.RxBytes != tt.wantRx || s.TxBytes != tt.wantTx {
				t.Errorf("rx/tx %d/%d, want %d/%d", s.RxBytes, s.TxBytes, tt.wantRx, tt.wantTx)
			}
			if tt.endpoint != "" && s.Endpoint != tt.endpoint {
				t.Errorf("endpoint %s, want %s", s.Endpoint, tt.endpoint)
			}
			if tt.wantNoMsg && s.Message != "" {
				t.Errorf("message %q, want none", s.Message)
			}
			if s.State == cable.StateConnected && tt.name[0] == 'a' && s.LastHandshake != now.Add(-42*time.Second) {
				t.Errorf("last handshake %v, want 42s before now", s.LastHandshake)
			}
		})
	}
}

func TestConnectionsOfOursThatTheDriverDoesNotKnowAreErrors(t *testing.T) {
	now := time.Now()
	sas := parseSAs([]map[string]any{
		saEvent("cbl-old", "ESTABLISHED", "5", map[string]any{"c": child("INSTALLED", "1", "1")}),
		saEvent("someone-elses", "ESTABLISHED", "5", nil),
	})
	got := connectionStatuses(nil, []string{"cbl-gone", "not-ours"}, sas, now, 1400)
	if len(got) != 2 || got[0].Cluster != "gone" || got[1].Cluster != "old" {
		t.Fatalf("got %+v, want cbl-gone and cbl-old only", got)
	}
	for _, s := range got {
		if s.State != cable.StateError || !strings.Contains(s.Message, "belongs to no cluster") {
			t.Errorf("%s: %s %q", s.Cluster, s.State, s.Message)
		}
	}
}
