package ipsec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
	"github.com/cablemesh/cablemesh/internal/statefile"
)

// This file is the host side of the driver: charon over VICI (d.client), our charon's files and
// process, and what a dead charon leaves on the host. Methods of Driver are called with d.mu
// held unless they say otherwise.

// initOwn decides the datapath and the MTU and renders strongswan.conf; then it adopts the
// charon an earlier run left when that is exactly the charon this run would start
// (decideAdoption), and otherwise stops any charon of ours, writes strongswan.conf and starts a
// new one. Either way the charon is supervised under life.
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
	paths, err := d.charonPaths()
	if err != nil {
		return err
	}
	text := []byte(renderConf(confParams{
		Port: d.cfg.Port, NATTPort: d.cfg.NATTPort, ViciSocket: paths.socket,
		Libipsec: libipsec, MTU: mtu, MSS: mssFor(mtu, d.node.LocalSubnets), NoRoutes: d.transport != nil,
	}))
	p := &charonProcess{charonPaths: paths, log: d.log.With("component", "charon")}
	p.onStart = func(ctx context.Context) { d.replay(ctx, p) }
	client := d.dial(paths.socket)
	var version map[string]any
	found, ref := inspectCharon(ctx, paths, func(ctx context.Context) (err error) {
		version, err = client.call(ctx, "version", nil)
		return err
	})
	verdict := decideAdoption(found, paths.conf, text)
	if verdict.Adopt {
		p.adopt(life, ref)
	} else {
		if found.PID != 0 {
			d.log.Info("not adopting the charon of an earlier run: starting a new one", "reason", verdict.Reason)
		}
		var stop []procRef
		if verdict.Stop {
			stop = append(stop, ref)
		}
		for _, r := range ourCharons(paths) {
			if !slices.Contains(stop, r) {
				stop = append(stop, r)
			}
		}
		stopProcs(d.log, stop)
		if err := writeFileAtomic(paths.conf, text, 0o600); err != nil {
			return err
		}
		if err := p.start(ctx, life); err != nil {
			return err
		}
		if version, err = client.call(ctx, "version", nil); err != nil {
			p.detach()
			stopProcs(d.log, ourCharons(paths))
			return err
		}
	}
	d.client, d.libipsec, d.mtu = client, libipsec, mtu
	d.charon.Store(p)
	d.underlayLink = linkName(u)
	if verdict.Adopt {
		d.adoptions.Add(1)
	}
	d.log.Info("ipsec ready", "charon", str(version["daemon"])+" "+str(version["version"]), "pid", p.PID(), "adopted", verdict.Adopt,
		"datapath", d.datapathLocked(), "port", d.cfg.Port, "nattPort", d.cfg.NATTPort, "mtu", mtu)
	return nil
}

// charonPaths are the files of our own charon, absolute.
func (d *Driver) charonPaths() (charonPaths, error) {
	dir, err := filepath.Abs(d.dir)
	if err != nil {
		return charonPaths{}, err
	}
	return charonPaths{
		binary:  d.cfg.Charon,
		conf:    filepath.Join(dir, confFile),
		socket:  filepath.Join(dir, socketFile),
		pidFile: filepath.Join(dir, pidFile),
		logFile: filepath.Join(dir, logFile),
	}, nil
}

// stopOwnCharon stops every charon of ours (Cleanup: it deletes its SAs, routes, rule and ipsec0
// as it goes), whether this driver started or adopted it, or only an earlier run knew it.
func (d *Driver) stopOwnCharon() error {
	paths, err := d.charonPaths()
	if err != nil {
		return err
	}
	stopProcs(d.log, ourCharons(paths))
	if left := ourCharons(paths); len(left) > 0 {
		return fmt.Errorf("charon pids %v still run", pidsOf(left))
	}
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
	d.underlayLink = linkName(u)
	d.log.Info("ipsec ready with the system charon", "vici", d.cfg.SystemVICI,
		"charon", str(version["daemon"])+" "+str(version["version"]), "datapath", d.datapathLocked())
	return nil
}

// connect makes charon hold want and its key psk: it reads first (list-conns, get-shared), lets
// planConn decide, and loads only what differs, reading the connection back. A connection charon
// already holds as wanted (loaded by this process, or by an earlier one whose charon was adopted)
// is taken into the driver's record without a word to charon.
func (d *Driver) connect(ctx context.Context, want desiredConn, psk []byte) error {
	msg := connMessage(want)
	id := keyID(want.Name, fingerprint(msg), psk)
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
	plan := planConn(loaded, ids, old, want, id)
	if plan.empty() && old != nil && old.keyID == id {
		return nil
	}
	// The key goes in before the connection, so an initiating connection finds it, except when
	// the connection is loaded on top of an identical-looking one: the key id claims the
	// connection's exact content (keyID), so it must not be in charon before that is true.
	// Likewise a connection to be taken down goes before the new key id comes.
	keyFirst := !(plan.loadConn && !plan.takeDown && loaded != nil)
	if plan.takeDown {
		if err := d.unloadConn(ctx, want.Name); err != nil {
			return err
		}
		wait := deleteWait
		if peerReplaced(loaded, want) {
			// The pair moves to another gateway of the remote cluster, most often because this
			// one died (the agent's probes found it, or the broker withdrew it): waiting for
			// its answer to our DELETE would hold the pair down for the whole wait.
			wait = replacedPeerDeleteWait
		}
		if err := d.terminateWithin(ctx, want.Name, wait); err != nil {
			return err
		}
	}
	loadKey := func() error {
		if err := d.loadShared(ctx, want, id, psk); err != nil {
			return err
		}
		log.Info("pre-shared key loaded", "id", id)
		return nil
	}
	if plan.loadKey && keyFirst {
		if err := loadKey(); err != nil {
			return err
		}
	}
	if plan.loadConn {
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
	if plan.loadKey && !keyFirst {
		if err := loadKey(); err != nil {
			return err
		}
	}
	// Keys of earlier keys or configurations go once the wanted one is in.
	for _, k := range plan.unloadKeys {
		if err := d.unloadShared(ctx, k); err != nil {
			return err
		}
	}
	lc := &loadedConn{want: want, keyID: id, psk: slices.Clone(psk), loadedAt: d.now()}
	switch {
	case plan.loadConn:
		lc.scheduleAfterLoad(d.now())
		if want.Initiator {
			d.kick()
		}
	case old != nil:
		// The connection and its SAs stay, and so does the keeper's schedule.
		lc.loadedAt = old.loadedAt
		lc.nextInitiate, lc.initBackoff, lc.up, lc.rejoin = old.nextInitiate, old.initBackoff, old.up, old.rejoin
	default:
		// Held by charon from an earlier agent run: taken over as it is. The keeper looks at its
		// SAs on its own clock and initiates only if it has none.
		log.Info("connection taken over from charon unchanged", "name", want.Name, "keyID", id)
	}
	if old != nil {
		clear(old.psk)
	}
	d.conns[want.Name] = lc
	return nil
}

func (d *Driver) loadShared(ctx context.Context, want desiredConn, id string, psk []byte) error {
	d.sharedLoads.Add(1)
	if _, err := d.client.call(ctx, "load-shared", sharedMessage(want, id, psk)); err != nil {
		// The error comes from charon and names no secret; it is safe to wrap.
		return fmt.Errorf("load shared key %s: %w", id, err)
	}
	return nil
}

func (d *Driver) unloadShared(ctx context.Context, id string) error {
	d.unloads.Add(1)
	if _, err := d.client.call(ctx, "unload-shared", map[string]any{"id": id}); err != nil {
		return fmt.Errorf("unload shared key %s: %w", id, err)
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

// How long terminate waits for the peer to answer the DELETE before charon destroys the SAs
// anyway (force): deleteWait in general, replacedPeerDeleteWait when the connection is loaded
// again towards another peer (peerReplaced), which is most often dead.
const (
	deleteWait             = 5 * time.Second
	replacedPeerDeleteWait = 100 * time.Millisecond
	// goneWait bounds how long terminateWithin waits for charon to destroy SAs it forced
	// after the DELETE went unanswered.
	goneWait = 2 * time.Second
)

// peerReplaced says whether want goes to another peer than the connection charon holds.
func peerReplaced(loaded map[string]any, want desiredConn) bool {
	return loaded != nil && !sameStrings(listOf(loaded["remote_addrs"]), []string{want.RemoteAddr.String()})
}

// terminate deletes the IKE_SAs (and their CHILD_SAs) of the connection name, if any, without
// waiting for the peer to answer longer than deleteWait (force): the peer may be gone.
func (d *Driver) terminate(ctx context.Context, name string) error {
	return d.terminateWithin(ctx, name, deleteWait)
}

// terminateWithin is terminate waiting at most wait for the peer's answer. charon answers a
// terminate whose wait ran out with an error and destroys the SAs right after (force); the SAs
// are then gone within goneWait, which this waits for, so what comes next (a connection to
// another peer with the same traffic selectors) does not race their removal.
func (d *Driver) terminateWithin(ctx context.Context, name string, wait time.Duration) error {
	n, err := d.countSAs(ctx, name)
	if err != nil || n == 0 {
		return err
	}
	d.terminates.Add(1)
	_, err = d.client.stream(ctx, "terminate", "control-log", map[string]any{"ike": name, "force": "yes", "timeout": strconv.FormatInt(wait.Milliseconds(), 10)})
	if err == nil || strings.Contains(err.Error(), "no matching SAs") {
		return nil
	}
	// Real time, not d.now: this waits on charon's clock.
	deadline := time.Now().Add(goneWait)
	for {
		n, lerr := d.countSAs(ctx, name)
		if lerr == nil && n == 0 {
			d.log.Info("SAs destroyed without the peer's answer to the DELETE", "name", name, "wait", wait)
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("terminate SAs of %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("terminate SAs of %s: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// countSAs is how many IKE_SAs of the connection name charon holds.
func (d *Driver) countSAs(ctx context.Context, name string) (int, error) {
	sas, err := d.client.stream(ctx, "list-sas", "list-sa", map[string]any{"ike": name, "noblock": "yes"})
	if err != nil {
		return 0, fmt.Errorf("list SAs of %s: %w", name, err)
	}
	return len(parseSAs(sas)[name]), nil
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

// replay loads every connection and key again into a restarted charon and has every one of them
// initiated at once, whatever this end's role (scheduleRejoin; the keeper is kicked at the end),
// so the pairs are up again within a round trip of the restart rather than when the peers' dead
// peer detection gives up on the old charon. It runs on the supervisor's goroutine.
func (d *Driver) replay(ctx context.Context, p *charonProcess) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.charon.Load() != p {
		return // Cleanup or Close is stopping this charon
	}
	d.keepTSAddresses()
	for name, c := range d.conns {
		if err := d.loadShared(ctx, c.want, c.keyID, c.psk); err != nil {
			d.log.Error("reload after charon restart", "cluster", c.want.Cluster, "err", err)
			continue
		}
		d.connLoads.Add(1)
		if _, err := d.client.call(ctx, "load-conn", connMessage(c.want)); err != nil {
			d.log.Error("reload after charon restart", "cluster", c.want.Cluster, "err", err)
			continue
		}
		c.loadedAt = d.now()
		c.scheduleRejoin(c.loadedAt)
		d.log.Info("connection reloaded after charon restart", "cluster", c.want.Cluster, "name", name, "initiator", c.want.Initiator)
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
	for _, id := range keyIDsOf(ids, name) {
		if err := d.unloadShared(ctx, id); err != nil {
			return err
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
		if n := connOfKeyID(id); clusterFromConn(n) != "" && !slices.Contains(names, n) {
			names = append(names, n)
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
// 220 once that table is empty. A charon of ours stopped with SIGTERM leaves nothing; this is
// for the other case.
func removeHostLeftovers() error {
	var errs []error
	if l, err := netlink.LinkByName(libipsecDevice); err == nil && l.Type() == "tuntap" {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", libipsecDevice, err))
		}
	}
	routes, err := nldump.Retry(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: charonTable}, netlink.RT_FILTER_TABLE)
	})
	if err == nil && len(routes) == 0 {
		rules, err := nldump.Retry(func() ([]netlink.Rule, error) { return netlink.RuleList(netlink.FAMILY_ALL) })
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

// removeStateDir removes StateDir/ipsec (strongswan.conf, the pid file, the logs and the socket's
// directory).
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

// linkName is the name of the underlay link, "" when no local link holds the advertise address
// or it cannot be read (then no MSS clamp covers kernel ESP, as before).
func linkName(u route.Underlay) string {
	if !u.Found() {
		return ""
	}
	l, err := netlink.LinkByIndex(u.Index)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}
