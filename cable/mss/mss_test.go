package mss

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func TestRuleExprsClampSYNsLeavingThroughThePrefix(t *testing.T) {
	ex := RuleExprs("cbl-*")
	if len(ex) != 10 {
		t.Fatalf("%d expressions, want 10", len(ex))
	}
	if m, ok := ex[0].(*expr.Meta); !ok || m.Key != expr.MetaKeyOIFNAME {
		t.Errorf("first expression = %#v, want meta oifname", ex[0])
	}
	// A wildcard match compares the prefix bytes only: with a NUL it would match "cbl-" exactly.
	if c, ok := ex[1].(*expr.Cmp); !ok || !bytes.Equal(c.Data, []byte("cbl-")) || c.Op != expr.CmpOpEq {
		t.Errorf("oifname compare = %#v", ex[1])
	}
	if c := ex[3].(*expr.Cmp); !bytes.Equal(c.Data, []byte{unix.IPPROTO_TCP}) {
		t.Errorf("l4proto compare = %#v", c)
	}
	if p := ex[4].(*expr.Payload); p.Base != expr.PayloadBaseTransportHeader || p.Offset != 13 || p.Len != 1 {
		t.Errorf("flags load = %#v", p)
	}
	if b := ex[5].(*expr.Bitwise); !bytes.Equal(b.Mask, []byte{0x06}) {
		t.Errorf("flags mask = %#v, want syn|rst", b)
	}
	if c := ex[6].(*expr.Cmp); !bytes.Equal(c.Data, []byte{0x02}) {
		t.Errorf("flags compare = %#v, want syn", c)
	}
	if r := ex[7].(*expr.Rt); r.Key != expr.RtTCPMSS || r.Register != 1 {
		t.Errorf("rt = %#v, want rt tcpmss", r)
	}
	if b := ex[8].(*expr.Byteorder); b.Op != expr.ByteorderHton || b.Size != 2 {
		t.Errorf("byteorder = %#v", b)
	}
	if e := ex[9].(*expr.Exthdr); e.Op != expr.ExthdrOpTcpopt || e.Type != 2 || e.Offset != 2 || e.Len != 2 || e.SourceRegister != 1 || e.DestRegister != 0 {
		t.Errorf("exthdr write = %#v", e)
	}
	if !writesMSS(ex) {
		t.Error("writesMSS does not recognise the rule")
	}
	if writesMSS(ex[:7]) {
		t.Error("writesMSS accepts a rule that writes nothing")
	}
}

func TestAnExactLinkIsComparedWithItsWholeName(t *testing.T) {
	// oifname "wg-east" as nft writes it: the 16-byte buffer the kernel loads, NUL-padded, so
	// "wg-east2" does not match.
	c, ok := RuleExprs("wg-east")[1].(*expr.Cmp)
	want := append([]byte("wg-east"), make([]byte, 16-len("wg-east"))...)
	if !ok || !bytes.Equal(c.Data, want) {
		t.Errorf("oifname compare for an exact name = %#v, want %q", c, want)
	}
}

func TestValidateLinks(t *testing.T) {
	tests := []struct {
		name  string
		links []string
		want  string
	}{
		{"the drivers' links are valid", []string{"cbl-wg0", "cbl-vx*", "ipsec0"}, ""},
		{"no link at all is an error", nil, "no link"},
		{"an empty link is an error", []string{"cbl-*", ""}, "[1] \"\" is empty"},
		{"a lone wildcard would match every interface", []string{"*"}, "[0] \"*\" is empty"},
		{"a wildcard inside is an error", []string{"cbl-*x"}, "has a '*' before its end"},
		{"a name longer than an interface name is an error", []string{"0123456789abcdef"}, "is 16 bytes, at most 15 fit"},
		{"a prefix of a full interface name is valid", []string{"0123456789abcde*"}, ""},
		{"a link with a slash is an error", []string{"a/b"}, "invalid character '/'"},
		{"a repeated link is an error", []string{"cbl-*", "cbl-*"}, `[1] "cbl-*" is listed twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateLinks(tt.links)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestSpecEqual(t *testing.T) {
	a := Want([]string{"cbl-*", "ipsec0"})
	if !a.Equal(Want([]string{"cbl-*", "ipsec0"})) {
		t.Error("equal specs differ")
	}
	if a.Equal(Want([]string{"ipsec0", "cbl-*"})) {
		t.Error("rule order is ignored")
	}
	b := Want([]string{"cbl-*", "ipsec0"})
	delete(b.Chains, ChainOutput)
	if a.Equal(b) || b.Equal(a) {
		t.Error("a missing chain is ignored")
	}
}
