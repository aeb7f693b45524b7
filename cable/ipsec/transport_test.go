package ipsec

import (
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// TestTransportConnectionProtectsOnlyTheEmbeddersTraffic: an embedded driver's connection is
// transport mode, its selectors the two underlay addresses narrowed to UDP on the given ports
// (whatever subnets the remote has), ESP without UDP encapsulation; and charon's list-conns
// answer in that form matches it.
func TestTransportConnectionProtectsOnlyTheEmbeddersTraffic(t *testing.T) {
	o := defaultOpts(t)
	o.Encap = false
	want, err := desiredTransport(testLocal, testRemote(), o, "udp", TransportPorts{Local: 4799, Remote: 4800})
	if err != nil {
		t.Fatal(err)
	}
	la, ra := testLocal.AdvertiseAddress.String(), testRemote().Address.String()
	conn := connMessage(want)[want.Name].(map[string]any)
	child := conn["children"].(map[string]any)[want.Name].(map[string]any)
	if child["mode"] != "transport" {
		t.Errorf("mode %v, want transport", child["mode"])
	}
	if got := child["local_ts"].([]string); len(got) != 1 || got[0] != la+"/32[udp/4799]" {
		t.Errorf("local_ts %v, want %s/32[udp/4799]", got, la)
	}
	if got := child["remote_ts"].([]string); len(got) != 1 || got[0] != ra+"/32[udp/4800]" {
		t.Errorf("remote_ts %v, want %s/32[udp/4800]", got, ra)
	}
	if conn["encap"] != "no" {
		t.Errorf("encap %v, want no", conn["encap"])
	}
	listed := map[string]any{
		"local_addrs": []string{la}, "remote_addrs": []string{ra},
		"children": map[string]any{want.Name: map[string]any{"local-ts": []string{la + "/32[udp/4799]"}, "remote-ts": []string{ra + "/32[udp/4800]"}}},
	}
	if !loadedMatches(listed, want) {
		t.Errorf("charon's list-conns form does not match the connection")
	}
	listed["children"] = map[string]any{want.Name: map[string]any{"local-ts": []string{la + "/32"}, "remote-ts": []string{ra + "/32"}}}
	if loadedMatches(listed, want) {
		t.Errorf("a connection without the ports matches the transport connection")
	}
	if _, err := desiredTransport(testLocal, testRemote(), o, "udp", TransportPorts{Local: 4799}); err == nil || !strings.Contains(err.Error(), "transport ports") {
		t.Errorf("a missing remote port: %v", err)
	}
}

func TestEmbeddedDriverHasItsOwnCharonAndNoRoutes(t *testing.T) {
	dir := t.TempDir()
	d, err := NewEmbedded(cable.LocalNode{Cluster: "east", StateDir: dir}, cable.Settings{"port": "4510", "nattPort": "4511"}, Transport{Name: "vxlan+ipsec", Proto: "udp"})
	if err != nil {
		t.Fatal(err)
	}
	if d.dir != dir+"/vxlan+ipsec" || d.cfg.Datapath != DatapathKernel {
		t.Errorf("dir %s datapath %s", d.dir, d.cfg.Datapath)
	}
	if err := d.Connect(t.Context(), testRemote(), nil); err == nil || !strings.Contains(err.Error(), "ConnectTransport") {
		t.Errorf("Connect on an embedded driver: %v", err)
	}
	if _, err := NewEmbedded(cable.LocalNode{StateDir: dir}, cable.Settings{"useSystemCharon": "/run/charon.vici"}, Transport{Name: "x", Proto: "udp"}); err == nil {
		t.Errorf("a system charon was accepted for transport mode")
	}
	conf := renderConf(confParams{Port: 4510, NATTPort: 4511, ViciSocket: "/s", MTU: 1438, MSS: 1398, NoRoutes: true})
	if !strings.Contains(conf, "install_routes = no") || !strings.Contains(conf, "routing_table = 0") {
		t.Errorf("the embedded charon's conf installs routes or the rule to table 220:\n%s", conf)
	}
	if plain := renderConf(confParams{Port: 500, NATTPort: 4500, ViciSocket: "/s", MTU: 1438, MSS: 1398}); strings.Contains(plain, "routing_table") || !strings.Contains(plain, "install_routes = yes") {
		t.Errorf("the ipsec driver's conf changed:\n%s", plain)
	}
}
