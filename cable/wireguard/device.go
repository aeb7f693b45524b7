package wireguard

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Device kinds as reported by Driver.DeviceKind.
const (
	KindKernel    = "kernel"
	KindUserspace = "userspace"
)

// UAPIDir is where wireguard-go serves, and wgctrl looks for, UAPI sockets. It is a path in the
// mount namespace, shared by every network namespace: see RunIsolated.
const UAPIDir = "/var/run/wireguard"

// UAPISocketPath is the UAPI socket of the userspace device named iface.
func UAPISocketPath(iface string) string { return filepath.Join(UAPIDir, iface+".sock") }

// wgDevice is the WireGuard link, kernel or in-process. Everything that configures peers, keys
// and ports goes through wgctrl for both kinds; this only creates and destroys the link.
type wgDevice interface {
	Kind() string
	// CanInitiate reports whether Initiate works on this kind of device.
	CanInitiate() bool
	// Initiate sends peer a fresh handshake initiation now, even within WireGuard's rate limit of
	// one initiation per REKEY_TIMEOUT (see handshake.go for why and when this is safe). Only a
	// userspace device can: the kernel offers no per-peer way to lift its rate limit short of
	// removing the peer.
	Initiate(peer wgtypes.Key) error
	// Close destroys the device (and for userspace its UAPI socket).
	Close() error
}

// errCannotInitiate is Initiate's error on a kernel device.
var errCannotInitiate = errors.New("a kernel WireGuard device cannot be made to send an initiation on demand")

// kernelDevice is a kernel WireGuard link, which outlives the agent process.
type kernelDevice struct{ name string }

func (k *kernelDevice) Kind() string { return KindKernel }

func (k *kernelDevice) CanInitiate() bool { return false }

func (k *kernelDevice) Initiate(wgtypes.Key) error { return errCannotInitiate }

func (k *kernelDevice) Close() error { return deleteLink(k.name) }

// userDevice is wireguard-go running in this process on a TUN device, configured over its UAPI
// socket. It dies with the process. It owns the UAPI accept loop and one goroutine per UAPI
// connection: Close ends them all and waits for them.
type userDevice struct {
	name    string
	dev     *device.Device
	uapi    net.Listener
	wg      sync.WaitGroup // the UAPI accept loop and its handlers
	closing chan struct{}
	closed  sync.Once
	err     error

	mu    sync.Mutex
	conns map[net.Conn]bool // UAPI connections being served
}

func (u *userDevice) Kind() string { return KindUserspace }

func (u *userDevice) CanInitiate() bool { return true }

// Initiate lifts the peer's rate limit with ExpireCurrentKeypairs, then sends an initiation.
// ExpireCurrentKeypairs clears the handshake in progress (a crossed one is lost anyway), resets
// the time of the last handshake sent, and stops the current and next keypairs from sending; it
// deletes no keypair, so every packet the peer sends on a session it holds still decrypts here
// (and confirms a next keypair), and the initiation that follows replaces the session for both.
func (u *userDevice) Initiate(k wgtypes.Key) error {
	p := u.dev.LookupPeer(device.NoisePublicKey(k))
	if p == nil {
		return fmt.Errorf("initiate handshake: no peer %s on %s", k, u.name)
	}
	p.ExpireCurrentKeypairs()
	if err := p.SendHandshakeInitiation(false); err != nil {
		return fmt.Errorf("initiate handshake with peer %s: %w", k, err)
	}
	return nil
}

func (u *userDevice) Close() error {
	u.closed.Do(func() {
		// Closing the listener unlinks the socket file and ends the accept loop; closing the
		// connections ends their handlers even when a client keeps one open; closing the device
		// closes the TUN, which removes the link and with it its routes.
		close(u.closing)
		lerr := u.uapi.Close()
		u.mu.Lock()
		for c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
		u.dev.Close()
		u.wg.Wait()
		if err := os.Remove(UAPISocketPath(u.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			u.err = fmt.Errorf("remove UAPI socket %s: %w", UAPISocketPath(u.name), err)
			return
		}
		// wireguard-go's UAPI listener closes its own wake-up pipe when it sees the socket file
		// go; a Close racing with that reports os.ErrClosed for a listener that is already shut.
		if lerr != nil && !errors.Is(lerr, net.ErrClosed) && !errors.Is(lerr, os.ErrClosed) {
			u.err = fmt.Errorf("close UAPI listener of %s: %w", u.name, lerr)
		}
	})
	return u.err
}

// serve runs the UAPI accept loop until Close.
func (u *userDevice) serve(log *slog.Logger) {
	defer u.wg.Done()
	for {
		c, err := u.uapi.Accept()
		if err != nil {
			select {
			case <-u.closing:
			default:
				// The listener also fails when someone deletes the socket file: the device
				// keeps forwarding but can no longer be configured or read.
				log.Error("UAPI listener stopped; device can no longer be configured", "socket", UAPISocketPath(u.name), "err", err)
			}
			return
		}
		u.mu.Lock()
		select {
		case <-u.closing:
			u.mu.Unlock()
			c.Close()
			return
		default:
		}
		u.conns[c] = true
		u.wg.Add(1)
		u.mu.Unlock()
		go func() {
			defer u.wg.Done()
			u.dev.IpcHandle(c) // closes c
			u.mu.Lock()
			delete(u.conns, c)
			u.mu.Unlock()
		}()
	}
}

// openDevice creates (or, for a kernel device left by an earlier agent run, adopts) the link.
// It tries the kernel first; when the kernel has no WireGuard it runs wireguard-go in-process.
// The link name is the agent's own: a userspace device's TUN link left by an agent that died
// (or is still being torn down after a SIGKILL) is removed and the device made afresh.
func openDevice(log *slog.Logger, name string, mtu int) (wgDevice, error) {
	la := netlink.NewLinkAttrs()
	la.Name = name
	la.MTU = mtu
	for replaced := false; ; replaced = true {
		err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: la})
		switch {
		case err == nil:
			log.Info("created kernel wireguard link")
			return &kernelDevice{name: name}, nil
		case errors.Is(err, syscall.EEXIST):
			l, lerr := netlink.LinkByName(name)
			if isLinkNotFound(lerr) {
				continue // gone meanwhile (a dead agent's TUN link torn down): create it now
			}
			if lerr != nil {
				return nil, fmt.Errorf("link %s exists but cannot be read: %w", name, lerr)
			}
			if l.Type() == "wireguard" {
				// A kernel device survives agent restarts: adopt it, so tunnels do not flap.
				log.Info("adopted existing kernel wireguard link")
				return &kernelDevice{name: name}, nil
			}
			if l.Type() != "tuntap" || replaced {
				return nil, fmt.Errorf("link %s exists with type %q, not wireguard (another process or an earlier device holds the name)", name, l.Type())
			}
			if err := removeLeftoverTUN(log, l); err != nil {
				return nil, err
			}
			continue
		}
		log.Info("kernel has no wireguard, using wireguard-go in-process", "err", err)
		return openUserDevice(log, name, mtu)
	}
}

// removeLeftoverTUN deletes l, a TUN link with this device's name, unless a live process serves
// the name's UAPI socket in this mount namespace (an agent run with CABLEMESH_WG_ISOLATED=0: its
// device is not ours to take; an isolated agent's socket is private, and the name in this
// network namespace is the agent's own). A userspace device's TUN link goes with the process
// that holds it, but not at once: an agent started again right after a kill finds it still there
// while its predecessor exits.
func removeLeftoverTUN(log *slog.Logger, l netlink.Link) error {
	name := l.Attrs().Name
	if uapiServed(name) {
		return fmt.Errorf("link %s exists with type tuntap and its UAPI socket %s is served by a live process: another agent holds the name", name, UAPISocketPath(name))
	}
	log.Warn("removing the userspace wireguard TUN link left by an earlier run", "link", name, "ifindex", l.Attrs().Index)
	if err := netlink.LinkDel(l); err != nil && !isLinkNotFound(err) && !errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("remove the TUN link %s left by an earlier run: %w", name, err)
	}
	return nil
}

// uapiServed reports whether a process answers on the UAPI socket of the device named iface.
func uapiServed(iface string) bool {
	c, err := net.DialTimeout("unix", UAPISocketPath(iface), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func openUserDevice(log *slog.Logger, name string, mtu int) (_ wgDevice, err error) {
	sock := UAPISocketPath(name)
	// A socket file left by a process that died is stale; one that answers belongs to a live
	// device (possibly in another network namespace sharing this mount namespace).
	if uapiServed(name) {
		return nil, fmt.Errorf("UAPI socket %s is served by another process: interface name %s is taken in this mount namespace (run the agent through wireguard.RunIsolated or pick another interface)", sock, name)
	}
	if rerr := os.Remove(sock); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale UAPI socket %s: %w", sock, rerr)
	}

	tdev, err := tun.CreateTUN(name, mtu)
	if err != nil {
		return nil, fmt.Errorf("create TUN %s: %w", name, err)
	}
	logger := &device.Logger{
		Verbosef: func(format string, args ...any) { log.Debug(fmt.Sprintf(format, args...)) },
		Errorf: func(format string, args ...any) {
			msg := fmt.Sprintf(format, args...)
			if strings.Contains(msg, "no known endpoint for peer") {
				// A held-back peer (handshake.go) has no endpoint on purpose.
				log.Debug(msg)
				return
			}
			log.Warn(msg)
		},
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), logger)
	defer func() {
		if err != nil {
			dev.Close()
		}
	}()

	f, err := ipc.UAPIOpen(name)
	if err != nil {
		return nil, fmt.Errorf("open UAPI socket %s: %w", sock, err)
	}
	l, err := ipc.UAPIListen(name, f)
	f.Close() // UAPIListen dups the descriptor
	if err != nil {
		os.Remove(sock)
		return nil, fmt.Errorf("listen on UAPI socket %s: %w", sock, err)
	}
	u := &userDevice{name: name, dev: dev, uapi: l, closing: make(chan struct{}), conns: map[net.Conn]bool{}}
	u.wg.Add(1)
	go u.serve(log)
	return u, nil
}
