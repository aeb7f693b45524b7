package nftables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/cablemesh/cablemesh/agent/ingress"
	"github.com/cablemesh/cablemesh/internal/scratchns"
)

// dump renders the table's chains and rules as text without handles: two dumps are equal when
// the kernel holds the same rules. Anonymous verdict maps are rendered by content.
func dump(t *testing.T, c *nftables.Conn) (string, map[string][]*nftables.Rule) {
	t.Helper()
	tab := &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatalf("list chains: %v", err)
	}
	var b strings.Builder
	byChain := map[string][]*nftables.Rule{}
	for _, ch := range chains {
		if ch.Table.Name != TableName {
			continue
		}
		rules, err := c.GetRules(tab, ch)
		if err != nil {
			t.Fatalf("get rules of %s: %v", ch.Name, err)
		}
		byChain[ch.Name] = rules
		fmt.Fprintf(&b, "chain %s\n", ch.Name)
		for _, r := range rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok {
					l2 := *l
					l2.SetID = 0 // transaction-local
					e = &l2
				}
				fmt.Fprintf(&b, " %T%+v", e, e)
			}
			b.WriteString("\n")
		}
	}
	return b.String(), byChain
}

func hasTable(t *testing.T, c *nftables.Conn) bool {
	t.Helper()
	tabs, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	for _, tb := range tabs {
		if tb.Name == TableName {
			return true
		}
	}
	return false
}

func TestKernelApplyReadBack(t *testing.T) {
	scratchns.Enter(t)
	ctx := context.Background()
	d, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}

	cfg := ingress.Config{
		MeshAddress:         ad("242.0.0.2"),
		RemoteMeshAddresses: []netip.Addr{ad("242.0.0.3"), ad("242.0.0.4")},
		Services: []ingress.Service{{Namespace: "ns", Name: "web", Ports: []ingress.Port{
			{Name: "http", Protocol: "TCP", IngressPort: 30001, Backends: []netip.AddrPort{ap("10.1.0.5:80"), ap("10.1.0.6:80")}},
			{Name: "one", Protocol: "UDP", IngressPort: 30002, Backends: []netip.AddrPort{ap("10.1.0.5:53")}},
			{Name: "none", Protocol: "TCP", IngressPort: 30003},
		}}},
	}
	if err := d.Apply(ctx, cfg); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	first, rules := dump(t, c)
	for chain, n := range map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainServices: 2, ChainInput: 1, ChainPostrouting: 1, "be-tcp-30001-0": 1, "be-tcp-30001-1": 1} {
		if got := len(rules[chain]); got != n {
			t.Errorf("chain %s holds %d rules, want %d\n%s", chain, got, n, first)
		}
	}
	for _, want := range []string{"*expr.Numgen&{Register:1 Modulus:2", "*expr.Reject&{Type:1 Code:0}", "Type:1 Family:2 RegAddrMin:1"} {
		if !strings.Contains(first, want) {
			t.Errorf("table lacks %q:\n%s", want, first)
		}
	}
	set, err := c.GetSetByName(&nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}, SetRemoteMesh)
	if err != nil {
		t.Fatalf("get set: %v", err)
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	if len(elems) != 2 {
		t.Errorf("remote_mesh holds %d elements, want 2", len(elems))
	}
	lb, err := c.GetSetByName(&nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}, "lb-tcp-30001")
	if err != nil {
		t.Fatalf("get map lb-tcp-30001: %v", err)
	}
	lbElems, err := c.GetSetElements(lb)
	if err != nil {
		t.Fatal(err)
	}
	chainsByKey := map[uint32]string{}
	for _, e := range lbElems {
		if len(e.Key) != 4 {
			continue
		}
		// The library does not decode a map's verdicts on read: find the chain name in the
		// raw NFTA_DATA_VERDICT attribute.
		for _, ch := range []string{"be-tcp-30001-0", "be-tcp-30001-1"} {
			if (e.VerdictData != nil && e.VerdictData.Chain == ch) || bytes.Contains(e.Val, []byte(ch+"\x00")) {
				chainsByKey[binaryutil.NativeEndian.Uint32(e.Key)] = ch
			}
		}
	}
	if chainsByKey[0] != "be-tcp-30001-0" || chainsByKey[1] != "be-tcp-30001-1" || len(chainsByKey) != 2 {
		t.Errorf("map lb-tcp-30001 = %v, want numgen 0 and 1 (host order) to the two backend chains", chainsByKey)
	}
	st := d.Status()
	if !st.Programmed || st.Ports != 3 || st.PortsWithoutBackends != 1 || st.Backends != 3 || st.Rules != 8 || st.MeshAddress != "242.0.0.2" || st.LastError != "" {
		t.Errorf("Status = %+v", st)
	}

	// Idempotent: the same Config (in another order) leaves the same table.
	cfg2 := cfg
	cfg2.RemoteMeshAddresses = []netip.Addr{ad("242.0.0.4"), ad("242.0.0.3")}
	if err := d.Apply(ctx, cfg2); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if second, _ := dump(t, c); second != first {
		t.Errorf("second Apply changed the table:\n%s\nwas\n%s", second, first)
	}

	// A bad Config is refused and leaves the table as it was.
	bad := cfg
	bad.Services = []ingress.Service{{Namespace: "ns", Name: "x", Ports: []ingress.Port{{Protocol: "SCTP", IngressPort: 1}}}}
	if err := d.Apply(ctx, bad); err == nil || !strings.Contains(err.Error(), `Protocol "SCTP"`) {
		t.Fatalf("bad Apply error = %v", err)
	}
	if after, _ := dump(t, c); after != first {
		t.Errorf("refused Apply changed the table:\n%s", after)
	}
	if st := d.Status(); !strings.Contains(st.LastError, "SCTP") || st.Ports != 3 {
		t.Errorf("Status after refusal = %+v", st)
	}

	// A table removed behind the data plane's back shows in Status, and Apply repairs it.
	c.DelTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := d.Status(); st.Programmed || !strings.Contains(st.LastError, "missing") {
		t.Errorf("Status after an outside delete = %+v, want not programmed", st)
	}
	if err := d.Apply(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if again, _ := dump(t, c); again != first || !d.Status().Programmed {
		t.Errorf("Apply did not restore the table:\n%s", again)
	}

	// No mesh address: no table.
	if err := d.Apply(ctx, ingress.Config{}); err != nil {
		t.Fatalf("empty Apply: %v", err)
	}
	if hasTable(t, c) {
		t.Error("table present after applying an empty Config")
	}

	// Cleanup removes table and link.
	if err := d.Apply(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := ingress.EnsureMeshLink(cfg.MeshAddress); err != nil {
		t.Fatalf("EnsureMeshLink: %v", err)
	}
	if err := d.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if hasTable(t, c) {
		t.Error("table present after Cleanup")
	}
	if err := d.Cleanup(ctx); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}
