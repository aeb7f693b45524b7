package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/internal/statefile"
)

// privateKeyFile is the node's WireGuard private key (base64, one line) under StateDir/wireguard.
// It is generated once and reused forever: the public key is published to the broker and every
// remote peer is configured with it, so a new key on restart would cut every tunnel.
const privateKeyFile = "private.key"

// loadOrCreateKey returns the private key stored in dir, creating dir and the key when absent.
// The file is 0600; a key file readable by others is tightened rather than trusted as is.
func loadOrCreateKey(dir string) (wgtypes.Key, error) {
	path := filepath.Join(dir, privateKeyFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		k, perr := wgtypes.ParseKey(strings.TrimSpace(string(data)))
		if perr != nil {
			// Never overwrite: a corrupt key file needs an operator, since replacing it changes
			// the identity every remote cluster has configured.
			return wgtypes.Key{}, fmt.Errorf("wireguard private key %s: %w", path, perr)
		}
		fi, serr := os.Stat(path)
		if serr != nil {
			return wgtypes.Key{}, fmt.Errorf("wireguard private key %s: %w", path, serr)
		}
		if fi.Mode().Perm() != 0o600 {
			if cerr := os.Chmod(path, 0o600); cerr != nil {
				return wgtypes.Key{}, fmt.Errorf("wireguard private key %s: tighten mode %v to 0600: %w", path, fi.Mode().Perm(), cerr)
			}
		}
		return k, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		return wgtypes.Key{}, fmt.Errorf("wireguard private key %s: %w", path, err)
	}

	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generate wireguard private key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard state directory %s: %w", dir, err)
	}
	if err := statefile.WriteAtomic(path, []byte(k.String()+"\n"), 0o600); err != nil {
		return wgtypes.Key{}, fmt.Errorf("wireguard private key %s: %w", path, err)
	}
	return k, nil
}
