package specs

import (
	"slices"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// TestEverySpecIsRegisteredWithoutADatapath: this package alone names all four drivers, with
// their traits, and builds none of them.
func TestEverySpecIsRegisteredWithoutADatapath(t *testing.T) {
	if got, want := cable.Names(), []string{"ipsec", "vxlan", "vxlan+ipsec", "wireguard"}; !slices.Equal(got, want) {
		t.Fatalf("cable.Names() = %v, want %v", got, want)
	}
	if got, want := cable.DefaultNames(), []string{"ipsec", "vxlan", "wireguard"}; !slices.Equal(got, want) {
		t.Errorf("cable.DefaultNames() = %v, want %v", got, want)
	}
	for _, name := range cable.Names() {
		if _, ok := cable.Lookup(name); ok {
			t.Errorf("%s has a datapath registered although only the specs are linked", name)
		}
	}
	if !slices.Contains(cable.DefaultNames(), cable.DefaultDriver) {
		t.Errorf("the mesh default driver %q is not a registered default driver (%v)", cable.DefaultDriver, cable.DefaultNames())
	}
}

// TestTraits: what diagnose and cablectl's tables rely on.
func TestTraits(t *testing.T) {
	spec := func(name string) cable.Spec {
		s, ok := cable.LookupSpec(name)
		if !ok {
			t.Fatalf("no spec %s", name)
		}
		return s
	}
	wg, ipsec, vxlan, vi := spec("wireguard"), spec("ipsec"), spec("vxlan"), spec("vxlan+ipsec")
	if wg.Traits.Handshake != cable.SessionHandshake || wg.Traits.HandshakeLifetime <= 0 || wg.Traits.PublicKeyAttribute != "publicKey" {
		t.Errorf("wireguard traits = %+v", wg.Traits)
	}
	if ipsec.Traits.Handshake != cable.EstablishedHandshake || ipsec.Traits.Daemon != "charon" || !ipsec.Traits.OwnsDaemonName {
		t.Errorf("ipsec traits = %+v", ipsec.Traits)
	}
	if vxlan.Traits.Handshake != cable.NoHandshake || vxlan.Traits.Daemon != "" {
		t.Errorf("vxlan traits = %+v", vxlan.Traits)
	}
	if vi.Traits.Handshake != cable.NoHandshake || vi.Traits.Daemon != "charon" || vi.Traits.OwnsDaemonName || !vi.OptIn {
		t.Errorf("vxlan+ipsec spec = %+v", vi)
	}
}

// TestWireguardPublishedKey: the spec checks the key as WireGuard parses one, without linking it.
func TestWireguardPublishedKey(t *testing.T) {
	for key, ok := range map[string]bool{
		"":    false,
		"abc": false,
		"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=":     true,  // 32 zero bytes
		"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==": false, // 34 bytes
	} {
		if err := cable.CheckPublished("wireguard", map[string]string{"publicKey": key}); (err == nil) != ok {
			t.Errorf("publicKey %q: err = %v, want ok=%v", key, err, ok)
		}
	}
}
