package wireguard

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable/route"
)

// host is everything the driver reads and changes on the host once its device exists: the
// WireGuard device through wgctrl (kernel and userspace alike), and its link and the routes over
// it through netlink. The real one is netHost; the driver's unit tests use a fake that records
// the changes, as the ipsec driver's viciClient does for charon.
type host interface {
	// Device reads the WireGuard device name: key, port and peers.
	Device(name string) (*wgtypes.Device, error)
	// ConfigureDevice changes the device name.
	ConfigureDevice(name string, cfg wgtypes.Config) error
	// Link reads the link name; errLinkNotFound when there is none.
	Link(name string) (linkState, error)
	// SetLinkMTU and SetLinkUp change the link.
	SetLinkMTU(l linkState, mtu int) error
	SetLinkUp(l linkState) error
	// DeleteLink deletes the link name; a link already gone is no error.
	DeleteLink(name string) error
	// Routes lists our routes (route.Protocol) over the link.
	Routes(l route.Link) ([]route.Spec, error)
	// ApplyRoutes applies plan over the link, calling changed once per route touched.
	ApplyRoutes(log *slog.Logger, l route.Link, plan route.Plan, changed func()) error
	// Sources picks this node's addresses inside local, per family, as route sources.
	Sources(local []netip.Prefix) (v4, v6 netip.Addr, err error)
	// Close releases the handles (the wgctrl client); the next call opens them again.
	Close() error
}

// linkState is a link as far as the driver cares.
type linkState struct {
	route.Link
	Type string // the kernel's link kind: "wireguard" for a kernel device, "tuntap" for ours
	MTU  int
	Up   bool
}

// netlink is the link as netlink's setters take it (they use the index).
func (l linkState) netlink() netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: l.Index, Name: l.Name}}
}

var errLinkNotFound = errors.New("link not found")

// netHost is the host through wgctrl and netlink, in the calling process's network namespace.
type netHost struct {
	mu     sync.Mutex
	client *wgctrl.Client // opened on first use
}

func (h *netHost) wg() (*wgctrl.Client, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client == nil {
		c, err := wgctrl.New()
		if err != nil {
			return nil, fmt.Errorf("open wgctrl: %w", err)
		}
		h.client = c
	}
	return h.client, nil
}

func (h *netHost) Device(name string) (*wgtypes.Device, error) {
	c, err := h.wg()
	if err != nil {
		return nil, err
	}
	dev, err := c.Device(name)
	if err != nil {
		return nil, fmt.Errorf("read device %s: %w", name, err)
	}
	return dev, nil
}

func (h *netHost) ConfigureDevice(name string, cfg wgtypes.Config) error {
	c, err := h.wg()
	if err != nil {
		return err
	}
	if err := c.ConfigureDevice(name, cfg); err != nil {
		return fmt.Errorf("configure device %s: %w", name, err)
	}
	return nil
}

func (h *netHost) Link(name string) (linkState, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return linkState{}, fmt.Errorf("find link %s: %w", name, errLinkNotFound)
		}
		return linkState{}, fmt.Errorf("find link %s: %w", name, err)
	}
	a := l.Attrs()
	return linkState{Link: route.Link{Index: a.Index, Name: name}, Type: l.Type(), MTU: a.MTU, Up: a.Flags&net.FlagUp != 0}, nil
}

func (h *netHost) SetLinkMTU(l linkState, mtu int) error {
	if err := netlink.LinkSetMTU(l.netlink(), mtu); err != nil {
		return fmt.Errorf("set MTU %d on %s: %w", mtu, l.Name, err)
	}
	return nil
}

func (h *netHost) SetLinkUp(l linkState) error {
	if err := netlink.LinkSetUp(l.netlink()); err != nil {
		return fmt.Errorf("set %s up: %w", l.Name, err)
	}
	return nil
}

func (h *netHost) DeleteLink(name string) error { return deleteLink(name) }

// deleteLink deletes the link name; a link already gone is no error.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

func (h *netHost) Routes(l route.Link) ([]route.Spec, error) { return route.List(l) }

func (h *netHost) ApplyRoutes(log *slog.Logger, l route.Link, plan route.Plan, changed func()) error {
	return route.Apply(log, l, plan, changed)
}

func (h *netHost) Sources(local []netip.Prefix) (netip.Addr, netip.Addr, error) {
	return route.Sources(local)
}

func (h *netHost) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.client == nil {
		return nil
	}
	err := h.client.Close()
	h.client = nil
	return err
}
