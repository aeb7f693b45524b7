package ipsec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
	"github.com/cablemesh/cablemesh/internal/statefile"
)

// This file is the host side of the driver: charon over VICI (d.client), our charon's files and
// process, and what a dead charon leaves on the host. Methods of Driver are called with d.mu
// held unless they say otherwise.

// initOwn decides the datapath and the MTU, writes strongswan.conf and starts our own charon
// under life.
func (d *Driver) initOwn(ctx, life context.Context) error {
	if fi, err := os.Stat(d.cfg.Charon); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return cable.BadSetting(Name, keyCharon, d.cfg.Charon, "is no charon executable (Debian: apt-get install strongswan-charon strongswan-swanctl libcharon-extra-plugins libstrongswan-standard-plugins): %v", err)
	}
	libipsec := d.cfg.Datapath == DatapathLibipsec
	if d.cfg.Datapath == DatapathAuto {
		has, err := KernelHasESP()
		if err != nil {
			d.log.Info("kernel has no usable ESP, using kernel-libipsec", "probe", err.Error())
		}
		libipsec = !has
	}
	v6 := d.node.AdvertiseAddress.Unmap().Is6()
	u, _ := route.FindUnderlay(d.log, d.node.AdvertiseAddress)
	mtu, err := tunnelMTU(d.cfg.MTU, u.MTU, libipsec, v6, allAEAD([]string{DefaultESPProposals}))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return err
	}
	// MkdirAll keeps an existing directory's mode.
	if err := os.Chmod(d.dir, 0o700); err != nil {
		return err
	}
	socket, err := filepath.Abs(filepath.Join(d.dir, socketFile))
	if err != nil {
		return err
	}
	conf := filepath.Join(filepath.Dir(socket), confFile)
	text := renderConf(confParams{
		Port: d.cfg.Port, NATTPort: d.cfg.NATTPort, ViciSocket: socket,
		Libipsec: libipsec, MTU: mtu, MSS: mssFor(mtu, d.node.LocalSubnets),
	})
	if err := writeFileAtomic(conf, []byte(text), 0o600); err != nil {
		return err
	}
	p := &charonProcess{
		binary: d.cfg.Charon,
		conf:   conf,
		socket: socket,
		log:    d.log.With("component", "charon"),
	}
	p.onStart = func(ctx context.Context) { d.replay(ctx, p) }
	if err := p.start(ctx, life); err != nil {
		return err
	}
	client := d.dial(socket)
	version, err := client.call(ctx, "version", nil)
	if err != nil {
		p.stop()
		return err
	}
	d.charon, d.client, d.libipsec, d.mtu = p, client, libipsec, mtu
	d.log.Info("ipsec ready", "charon", str(version["daemon"])+" "+str(version["version"]),
		"datapath", d.datapathLocked(), "port", d.cfg.Port, "nattPort", d.cfg.NATTPort, "mtu", mtu)
	return nil
}

// initSystem checks that the system charon answers and observes its datapath.
func (d *Driver) initSystem(ctx context.Context) error {
	client := d.dial(d.cfg.SystemVICI)
	version, err := client.call(ctx, "version", nil)
	if err != nil {
		return fmt.Errorf("system charon at %s.%s %q: %w", Name, keyUseSystemCharon, d.cfg.SystemVICI, err)
	}
	// The system charon's own configuration decides the datapath and the route MTU; we can only
	// observe the first.
	_, err = netlink.LinkByName(libipsecDevice)
	d.client, d.libipsec = client, err == nil
	u, _ := route.FindUnderlay(d.log, d.node.AdvertiseAddress)
	d.mtu, _ = tunnelMTU(d.cfg.MTU, u.MTU, d.libipsec, d.node.AdvertiseAddress.Unmap().Is6(), true)
	d.log.Info("ipsec ready with the system charon", "vici", d.cfg.SystemVICI,
		"charon", str(version["daemon"])+" "+str(version["version"]), "datapath", d.datapathLocked())
	return nil
}

// connect makes charon hold want and its key psk: it reads first (list-conns, get-shared), lets
// planConn decide, and loads only what differs, reading the connection back.
func (d *Driver) connect(ctx context.Context, want desiredConn, psk []byte) error {
	msg := connMessage(want)
	fp := fingerprint(msg)
	digest := pskDigest(psk)
	log := d.log.With("cluster", want.Cluster, "node", want.Node, "peer", want.RemoteAddr.String())

	loaded, err := d.listConn(ctx, want.Name)
	if err != nil {
		return err
	}
	ids, err := d.sharedIDs(ctx)
	if err != nil {
		return err
	}
	old := d.conns[want.Name]
	plan := planConn(loaded, ids, old, want, fp, digest)
	if plan.empty() {
		return nil
	}
	// The key first, so an initiating connection finds it.
	if plan.loadKey {
		if err := d.loadShared(ctx, want, psk); err != nil {
			return err
		}
		log.Info("pre-shared key loaded", "id", want.Name)
	}
	if plan.loadConn {
		if plan.takeDown {
			if err := d.unloadConn(ctx, want.Name); err != nil {
				return err
			}
			if err := d.terminate(ctx, want.Name); err != nil {
				return err
			}
		}
		d.connLoads.Add(1)
		if _, err := d.client.call(ctx, "load-conn", msg); err != nil {
			return err
		}
		// Read back: charon may have parsed something differently than we meant.
		loaded, err = d.listConn(ctx, want.Name)
		if err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		if loaded == nil || !loadedMatches(loaded, want) {
			return fmt.Errorf("charon did not keep the connection %s as loaded (list-conns shows %v)", want.Name, loaded)
		}
		log.Info("connection loaded", "name", want.Name, "initiator", want.Initiator,
			"localTS", want.LocalTS, "remoteTS", want.RemoteTS, "remotePort", want.RemotePort)
	}
	lc := &loadedConn{want: want, fingerprint: fp, psk: slices.Clone(psk), digest: digest, loadedAt: d.now()}
	if plan.loadConn {
		lc.scheduleAfterLoad(d.now())
		if want.Initiator {
			d.kick()
		}
	} else {
		// Only the key was loaded again: the connection and its SAs stay, and so does the
		// keeper's schedule.
		lc.loadedAt = old.loadedAt
		lc.nextInitiate, lc.initBackoff, lc.up = old.nextInitiate, old.initBackoff, old.up
	}
	if old != nil {
		clear(old.psk)
	}
	d.conns[want.Name] = lc
	return nil
}

func (d *Driver) loadShared(ctx context.Context, want desiredConn, psk []byte) error {
	d.sharedLoads.Add(1)
	if _, err := d.client.call(ctx, "load-shared", sharedMessage(want, psk)); err != nil {
		// The error comes from charon and names no secret; it is safe to wrap.
		return fmt.Errorf("load shared key %s: %w", want.Name, err)
	}
	return nil
}

func (d *Driver) unloadConn(ctx context.Context, name string) error {
	d.unloads.Add(1)
	if _, err := d.client.call(ctx, "unload-conn", map[string]any{"name": name}); err != nil {
		return fmt.Errorf("unload connection %s: %w", name, err)
	}
	return nil
}

// terminate deletes the IKE_SAs (and their CHILD_SAs) of the connection name, if any, without
// waiting for the peer to answer (force): the peer may be gone.
func (d *Driver) terminate(ctx context.Context, name string) error {
	sas, err := d.client.stream(ctx, "list-sas", "list-sa", map[string]any{"ike": name, "noblock": "yes"})
	if err != nil {
		return fmt.Errorf("list SAs of %s: %w", name, err)
	}
	if len(parseSAs(sas)[name]) == 0 {
		return nil
	}
	d.terminates.Add(1)
	_, err = d.client.stream(ctx, "terminate", "control-log", map[string]any{"ike": name, "force": "yes", "timeout": "5000"})
	if err != nil && !strings.Contains(err.Error(), "no matching SAs") {
		return fmt.Errorf("terminate SAs of %s: %w", name, err)
	}
	return nil
}

// listConn returns the list-conns section of the connection name, nil when charon has none.
func (d *Driver) listConn(ctx context.Context, name string) (map[string]any, error) {
	evs, err := d.client.stream(ctx, "list-conns", "list-conn", map[string]any{"ike": name})
	if err != nil {
		return nil, fmt.Errorf("list connection %s: %w", name, err)
	}
	for _, ev := range evs {
		if sec, ok := ev[name].(map[string]any); ok {
			return sec, nil
		}
	}
	return nil, nil
}

// ourConns lists the names of every connection of ours (ConnPrefix) charon holds.
func (d *Driver) ourConns(ctx context.Context) ([]string, error) {
	evs, err := d.client.stream(ctx, "list-conns", "list-conn", nil)
	if err != nil {
		return nil, fmt.Errorf("list connections: %w", err)
	}
	var out []string
	for _, ev := range evs {
		for name := range ev {
			if clusterFromConn(name) != "" {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// sharedIDs lists the ids of the shared keys loaded over VICI (the keys themselves are never
// returned by charon).
func (d *Driver) sharedIDs(ctx context.Context) ([]string, error) {
	resp, err := d.client.call(ctx, "get-shared", nil)
	if err != nil {
		return nil, fmt.Errorf("list shared key ids: %w", err)
	}
	return listOf(resp["keys"]), nil
}

// replay loads every connection and key again into a restarted charon. It runs on the
// supervisor's goroutine.
func (d *Driver) replay(ctx context.Context, p *charonProcess) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.charon != p {
		return // Cleanup or Close is stopping this charon
	}
	for name, c := range d.conns {
		if err := d.loadShared(ctx, c.want, c.psk); err != nil {
			d.log.Error("reload after charon restart", "cluster", c.want.Cluster, "err", err)
			continue
		}
		d.connLoads.Add(1)
		if _, err := d.client.call(ctx, "load-conn", connMessage(c.want)); err != nil {
			d.log.Error("reload after charon restart", "cluster", c.want.Cluster, "err", err)
			continue
		}
		c.loadedAt = d.now()
		c.scheduleAfterLoad(c.loadedAt)
		d.log.Info("connection reloaded after charon restart", "cluster", c.want.Cluster, "name", name)
	}
	d.kick()
}

// remove unloads the connection (so nothing restarts it), terminates its SAs, unloads its key
// and forgets it; each step only when charon still holds the thing.
func (d *Driver) remove(ctx context.Context, name string) error {
	loaded, err := d.listConn(ctx, name)
	if err != nil {
		return err
	}
	if loaded != nil {
		if err := d.unloadConn(ctx, name); err != nil {
			return err
		}
	}
	if err := d.terminate(ctx, name); err != nil {
		return err
	}
	ids, err := d.sharedIDs(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(ids, name) {
		d.unloads.Add(1)
		if _, err := d.client.call(ctx, "unload-shared", map[string]any{"id": name}); err != nil {
			return fmt.Errorf("unload shared key %s: %w", name, err)
		}
	}
	if c, ok := d.conns[name]; ok {
		d.log.Info("disconnected", "cluster", c.want.Cluster)
		d.forget(name)
	}
	return nil
}

// removeAll removes every connection and key of ours charon holds or this driver loaded.
func (d *Driver) removeAll(ctx context.Context) error {
	var errs []error
	names, err := d.ourConns(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for n := range d.conns {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	ids, err := d.sharedIDs(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range ids {
		if clusterFromConn(id) != "" && !slices.Contains(names, id) {
			names = append(names, id)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		errs = append(errs, d.remove(ctx, n))
	}
	return errors.Join(errs...)
}

// removeHostLeftovers removes what a charon that died without cleaning up (SIGKILL) leaves in
// this network namespace: the ipsec0 TUN device (with its routes), and charon's rule to table
// 220 once that table is empty. A charon of ours stops cleanly and leaves nothing; this is for
// the other case.
func removeHostLeftovers() error {
	var errs []error
	if l, err := netlink.LinkByName(libipsecDevice); err == nil && l.Type() == "tuntap" {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", libipsecDevice, err))
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: charonTable}, netlink.RT_FILTER_TABLE)
	if err == nil && len(routes) == 0 {
		rules, err := netlink.RuleList(netlink.FAMILY_ALL)
		if err == nil {
			for _, r := range rules {
				if r.Table == charonTable && r.Priority == charonTable {
					r := r
					if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, os.ErrNotExist) {
						errs = append(errs, fmt.Errorf("delete rule to table %d: %w", charonTable, err))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// removeStateDir removes StateDir/ipsec (strongswan.conf and the socket's directory).
func removeStateDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// writeFileAtomic writes data to path through a temporary file in the same directory.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := statefile.WriteAtomic(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
