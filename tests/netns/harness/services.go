package harness

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// The services datapath of a mesh. Every mesh has:
//
//	<dir>/bpffs             a bpf filesystem of its own: each node's agent pins its maps and links
//	                        in <dir>/bpffs/<node> (bpfPinDir); unmounting it at teardown releases
//	                        every pin
//	<root>/<prefix><node>   a cgroup per node in the host's cgroup2 hierarchy (<root> is where
//	                        cgroup2 is mounted), bind-mounted at <dir>/cgroups/<node>, the node
//	                        agent's cgroupPath: its socket hooks attach there, and the pod clients
//	                        of a test run in it
//
// Both mounts lie outside /sys, so the agents, which run under `ip netns exec` (it remounts
// /sys), see them; both are in the host's mount namespace, so pins outlive an agent restart as on
// a real node. A bind mount shows one cgroup only: removing the run's dir can never reach the
// rest of the hierarchy. Each gateway's agent serves DNS (dns.listen) on its pod-facing address,
// port 53.

// DNSPort is the port every gateway's agent serves clusterset.local on.
const DNSPort = 53

// CgroupRoot is where cgroup2 is mounted on this machine ("" when nowhere).
var CgroupRoot = func() string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	return ""
}()

// mountDatapath mounts the mesh's bpffs.
func (m *Mesh) mountDatapath() error {
	if CgroupRoot == "" {
		return errors.New("the services datapath needs cgroup2 mounted at /sys/fs/cgroup/unified or /sys/fs/cgroup")
	}
	m.BPFFS = filepath.Join(m.Dir, "bpffs")
	if err := os.MkdirAll(m.BPFFS, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpf", m.BPFFS, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", m.BPFFS, err)
	}
	return nil
}

// NodeCgroup creates (once) the cgroup of node name, bind-mounted into the run's dir, and
// returns the bind mount's path (the agent's cgroupPath).
func (m *Mesh) NodeCgroup(name string) string {
	m.T.Helper()
	host := filepath.Join(CgroupRoot, m.Prefix+name)
	bind := filepath.Join(m.Dir, "cgroups", name)
	if err := os.Mkdir(host, 0o755); errors.Is(err, os.ErrExist) {
		return bind
	} else if err != nil {
		m.T.Fatalf("create cgroup %s: %v", host, err)
	}
	if err := os.MkdirAll(bind, 0o700); err != nil {
		m.T.Fatalf("cgroup bind mount point: %v", err)
	}
	if err := unix.Mount(host, bind, "", unix.MS_BIND, ""); err != nil {
		m.T.Fatalf("bind-mount cgroup %s at %s: %v", host, bind, err)
	}
	return bind
}

// HostCgroup is the path of node name's cgroup in the host's hierarchy.
func (m *Mesh) HostCgroup(name string) string { return filepath.Join(CgroupRoot, m.Prefix+name) }

// unmountDatapath unmounts the cgroups' bind mounts, kills what runs in the mesh's cgroups and
// removes them, then unmounts the bpffs (which releases every pin, so the hooks and counters
// detach). It reports whether the run's dir is safe to remove (nothing is mounted there).
func (m *Mesh) unmountDatapath() (safe bool, errs []error) {
	safe = true
	binds, _ := filepath.Glob(filepath.Join(m.Dir, "cgroups", "*"))
	for _, b := range binds {
		if err := unix.Unmount(b, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs, safe = append(errs, fmt.Errorf("unmount %s: %w", b, err)), false
		}
	}
	if CgroupRoot != "" {
		entries, _ := os.ReadDir(CgroupRoot)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), m.Prefix) {
				if err := nstest.RemoveCgroup(filepath.Join(CgroupRoot, e.Name())); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if m.BPFFS != "" {
		if err := unix.Unmount(m.BPFFS, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs, safe = append(errs, fmt.Errorf("unmount %s: %w", m.BPFFS, err)), false
		}
	}
	return safe, errs
}

// sweepStaleDatapath unmounts what a crashed run left mounted below its temp dir and removes
// its cgroups; it reports whether the dir is safe to remove.
func sweepStaleDatapath(dir string) bool {
	safe := true
	binds, _ := filepath.Glob(filepath.Join(dir, "cgroups", "*"))
	for _, p := range append(binds, filepath.Join(dir, "bpffs")) {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			safe = false
		}
	}
	if m := runPrefixRE.FindStringSubmatch(filepath.Base(dir)); m != nil && CgroupRoot != "" {
		entries, _ := os.ReadDir(CgroupRoot)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), m[1]) {
				_ = nstest.RemoveCgroup(filepath.Join(CgroupRoot, e.Name()))
			}
		}
	}
	return safe
}

// datapathConfig is the services part of a node's agent config.
func (m *Mesh) datapathConfig(node string, dnsListen netip.Addr) string {
	return m.datapathConfigDNS(node, dnsListen, "")
}

// datapathConfigDNS is datapathConfig with dnsExtra (flow-mapping entries, e.g.
// `upstream: "172.31.0.1:53"`) added to the dns block; a dnsExtra that sets listen itself
// replaces the default listen address.
func (m *Mesh) datapathConfigDNS(node string, dnsListen netip.Addr, dnsExtra string) string {
	s := fmt.Sprintf("cgroupPath: %s\nbpfPinDir: %s\n", m.NodeCgroup(node), filepath.Join(m.BPFFS, node))
	switch {
	case strings.Contains(dnsExtra, "listen:"):
		s += fmt.Sprintf("dns: {%s}\n", dnsExtra)
	case dnsListen.IsValid() && dnsExtra != "":
		s += fmt.Sprintf("dns: {listen: \"%s\", %s}\n", netip.AddrPortFrom(dnsListen, DNSPort), dnsExtra)
	case dnsListen.IsValid():
		s += fmt.Sprintf("dns: {listen: \"%s\"}\n", netip.AddrPortFrom(dnsListen, DNSPort))
	}
	return s
}

// DNSAddr is where the cluster's gateway agent serves DNS.
func (c *Cluster) DNSAddr() netip.AddrPort { return netip.AddrPortFrom(c.GwPodIP, DNSPort) }

// Cgroup is the gateway's cgroup, which its agent's socket hooks attach to.
func (c *Cluster) Cgroup() string { return c.m.NodeCgroup(c.Name + "-gw") }

// PodArgv is argv run in the cluster's pod namespace inside the gateway's cgroup: the process
// enters the cgroup before it execs anything, so even its first connect goes through the hooks.
func (c *Cluster) PodArgv(argv ...string) []string {
	c.Cgroup()
	return podArgv(c.m.HostCgroup(c.Name+"-gw"), c.PodNS, argv...)
}

// podArgv is argv run in network namespace podNS inside the host cgroup cgroup, which it enters
// before it execs anything.
func podArgv(cgroup, podNS string, argv ...string) []string {
	procs := filepath.Join(cgroup, "cgroup.procs")
	return append([]string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, procs, "ip", "netns", "exec", podNS}, argv...)
}

// PodRun runs argv in the pod namespace and the gateway's cgroup, to completion.
func (c *Cluster) PodRun(timeout time.Duration, argv ...string) Result {
	full := c.PodArgv(argv...)
	return RunTimeout(c.m.Ctx, timeout, full[0], full[1:]...)
}

// StartPod starts argv as a tracked process in the pod namespace and the gateway's cgroup.
func (c *Cluster) StartPod(name string, argv ...string) *Process {
	c.m.T.Helper()
	p, err := StartProcess(name, "", filepath.Join(c.m.Dir, name+".log"), c.PodArgv(argv...)...)
	c.m.must(err)
	c.m.track(p)
	return p
}

// StartServer starts a tcpcheck server (mode hello or udpecho) in the cluster's pod namespace
// (outside the cgroup: servers need no translation), answering reply, and waits until it listens.
func (c *Cluster) StartServer(mode string, port uint16, reply string) *Process {
	m := c.m
	m.T.Helper()
	name := fmt.Sprintf("tcpcheck-%s-%s-%d", mode, c.Name, port)
	p, err := StartProcess(name, c.PodNS, filepath.Join(m.Dir, name+".log"), m.Bin.TCPCheck, mode, "-listen", fmt.Sprintf(":%d", port), "-reply", reply)
	m.must(err)
	m.track(p)
	if err := WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(p.Log(), "listening"), p.Log()
	}); err != nil {
		m.T.Fatalf("%s: %v", name, err)
	}
	return p
}

// Hello is what `tcpcheck ask` and `tcpcheck udpask` report of one exchange.
type Hello struct {
	Reply string `json:"reply"`
	// Peer is getpeername (TCP) or the reply's source (UDP): the VIP when translated.
	Peer  string `json:"peer"`
	Micro int64  `json:"us"`
	Error string `json:"error,omitempty"`
	Errno int    `json:"errno,omitempty"`
	// At is when the exchange ended (unix ns).
	At int64 `json:"at"`
}

// Ask connects from the cluster's pod (in its cgroup) to addr with tcpcheck ask (TCP, or udpask
// with udp) and returns the greeting.
func (c *Cluster) Ask(udp bool, addr netip.AddrPort, timeout time.Duration) (Hello, error) {
	return c.m.ask(c.PodArgv, udp, addr, timeout)
}

// ask runs tcpcheck ask (or udpask) with inPod, which wraps an argv to run in a pod (PodArgv).
func (m *Mesh) ask(inPod func(argv ...string) []string, udp bool, addr netip.AddrPort, timeout time.Duration) (Hello, error) {
	mode := "ask"
	if udp {
		mode = "udpask"
	}
	full := inPod(m.Bin.TCPCheck, mode, "-addr", addr.String(), "-timeout", timeout.String())
	r := RunTimeout(m.Ctx, timeout+10*time.Second, full[0], full[1:]...)
	var h Hello
	if err := json.Unmarshal([]byte(lastLine(r.Stdout)), &h); err != nil {
		return h, fmt.Errorf("%s: %w", r, err)
	}
	if h.Error != "" {
		return h, errors.New(h.Error)
	}
	return h, nil
}

// ReadHellos reads the JSON lines a tcpcheck process has written so far.
func ReadHellos(p *Process) []Hello {
	var out []Hello
	sc := bufio.NewScanner(strings.NewReader(p.Log()))
	for sc.Scan() {
		var h Hello
		if strings.HasPrefix(sc.Text(), "{") && json.Unmarshal(sc.Bytes(), &h) == nil {
			out = append(out, h)
		}
	}
	return out
}

// DigResult is one dig answer.
type DigResult struct {
	Status    string   // NOERROR, NXDOMAIN, SERVFAIL, ...
	Answer    []string // answer records, "name ttl class type data"
	Authority []string
	Raw       string
}

var digStatusRE = regexp.MustCompile(`status: ([A-Z]+)`)

// Dig queries server for name and type with dig from namespace ns.
func (m *Mesh) Dig(ns string, server netip.AddrPort, name, qtype string) DigResult {
	m.T.Helper()
	r := NSRun(m.Ctx, ns, "dig", "@"+server.Addr().String(), "-p", strconv.Itoa(int(server.Port())),
		"+time=2", "+tries=2", "+noall", "+comments", "+answer", "+authority", name, qtype)
	res := DigResult{Raw: r.Stdout + r.Stderr}
	if mm := digStatusRE.FindStringSubmatch(r.Stdout); mm != nil {
		res.Status = mm[1]
	}
	section := ""
	for _, l := range strings.Split(r.Stdout, "\n") {
		switch {
		case strings.HasPrefix(l, ";; ANSWER SECTION"):
			section = "answer"
		case strings.HasPrefix(l, ";; AUTHORITY SECTION"):
			section = "authority"
		case strings.HasPrefix(l, ";") || strings.TrimSpace(l) == "":
			if strings.TrimSpace(l) == "" {
				section = ""
			}
		case section == "answer":
			res.Answer = append(res.Answer, strings.Join(strings.Fields(l), " "))
		case section == "authority":
			res.Authority = append(res.Authority, strings.Join(strings.Fields(l), " "))
		}
	}
	return res
}

// Data is the data (last field onward after the type) of each answer of type qtype.
func (d DigResult) Data(qtype string) []string {
	var out []string
	for _, a := range d.Answer {
		f := strings.Fields(a)
		if len(f) >= 5 && f[3] == qtype {
			out = append(out, strings.Join(f[4:], " "))
		}
	}
	return out
}

// HasSOA says whether the authority section holds the zone's SOA.
func (d DigResult) HasSOA() bool {
	for _, a := range d.Authority {
		if f := strings.Fields(a); len(f) >= 4 && f[3] == "SOA" {
			return true
		}
	}
	return false
}
