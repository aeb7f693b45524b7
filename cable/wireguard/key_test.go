package wireguard

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

func TestPrivateKeyIsCreatedOnceWithMode0600(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wireguard")
	k1, err := loadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, privateKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode = %v, want 0600", fi.Mode().Perm())
	}
	k2, err := loadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k1 != k2 {
		t.Errorf("second load gave another key: %s != %s", k1.PublicKey(), k2.PublicKey())
	}
}

func TestPrivateKeyFileReadableByOthersIsTightened(t *testing.T) {
	dir := t.TempDir()
	k1, err := loadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, privateKeyFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	k2, err := loadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if k1 != k2 || fi.Mode().Perm() != 0o600 {
		t.Errorf("after chmod 0644: same key %v, mode %v; want the same key and 0600", k1 == k2, fi.Mode().Perm())
	}
}

func TestCorruptPrivateKeyIsAnErrorAndNotReplaced(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, privateKeyFile)
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateKey(dir); err == nil {
		t.Fatal("loadOrCreateKey accepted a corrupt key file")
	}
	data, _ := os.ReadFile(path)
	if string(data) != "not a key\n" {
		t.Errorf("corrupt key file was rewritten to %q", data)
	}
}

// The key is the same across two drivers built on one state directory, as across agent restarts.
// Init needs root (it creates a device); the key half of it does not, so this uses loadOrCreateKey
// through the driver's own directory.
func TestTwoDriversOnOneStateDirShareTheKey(t *testing.T) {
	state := t.TempDir()
	var pubs []string
	for i := 0; i < 2; i++ {
		d, err := NewDriver(cable.LocalNode{Cluster: "a", Node: "n", StateDir: state}, nil)
		if err != nil {
			t.Fatal(err)
		}
		k, err := loadOrCreateKey(d.dir)
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, k.PublicKey().String())
	}
	if pubs[0] != pubs[1] {
		t.Errorf("public keys differ across drivers: %v", pubs)
	}
	if _, err := os.Stat(filepath.Join(state, "wireguard", privateKeyFile)); err != nil {
		t.Errorf("key not under StateDir/wireguard: %v", err)
	}
}
