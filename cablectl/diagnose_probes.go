package cablectl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/miekg/dns"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cablectl/diagnose"
)

// The probes of `cablectl diagnose`: the I/O the pure checks in ./diagnose need. cablectl runs
// on the node, in the agent's network namespace, so its probes take the agent's routes.

// mtuProbeCount and mtuProbeDeadline shape each ping run: a few probes, so one lost to chance
// does not fail the check, within a deadline that bounds the command on a black hole.
const (
	mtuProbeCount    = 3
	mtuProbeDeadline = 3 * time.Second
)

// runProbes runs every probe the status calls for, concurrently.
func runProbes(ctx context.Context, s *statusapi.Status) diagnose.Probes {
	p := diagnose.Probes{MTU: map[string]diagnose.MTUProbe{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range diagnose.MTUTargets(s) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := probeMTU(ctx, t)
			mu.Lock()
			p.MTU[t.Cluster] = r
			mu.Unlock()
		}()
	}
	if server := diagnose.DNSServer(s); server != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := probeDNS(server)
			mu.Lock()
			p.DNS = &r
			mu.Unlock()
		}()
	}
	if diagnose.LoadBalancerOn(s) {
		r := probeEBPF(s.Services.LoadBalancer.PinDir, s.Services.LoadBalancer.CgroupPath)
		p.EBPF = &r
	}
	wg.Wait()
	return p
}

// probeMTU pings the remote probe address through the cable with DF set at the connection's MTU
// (ping -M do -s MTU-28), and with small probes for comparison, both at once.
func probeMTU(ctx context.Context, t diagnose.MTUTarget) diagnose.MTUProbe {
	r := diagnose.MTUProbe{Source: t.Source, Target: t.Target, MTU: t.MTU, Size: diagnose.PayloadSize(t.MTU, t.Target)}
	if r.Size <= 0 {
		r.Error = fmt.Sprintf("MTU %d is too small to probe", t.MTU)
		return r
	}
	var big, small pingResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); big = ping(ctx, t.Source, t.Target, r.Size, true) }()
	go func() { defer wg.Done(); small = ping(ctx, t.Source, t.Target, 56, false) }()
	wg.Wait()
	r.Sent, r.Received, r.SmallSent, r.SmallReceived = big.sent, big.received, small.sent, small.received
	if big.err != "" {
		r.Error = big.err
	}
	return r
}

type pingResult struct {
	sent, received int
	err            string // the run failed, or ping reported a local error
}

var (
	pingSummary    = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (?:packets )?received`)
	pingLocalError = regexp.MustCompile(`(?m)^.*(?:local error|Message too long|message too long).*$`)
)

// ping runs the system ping (iputils) from source to target: size-byte payloads, DF set when df.
func ping(ctx context.Context, source, target string, size int, df bool) pingResult {
	args := []string{"-n", "-c", strconv.Itoa(mtuProbeCount), "-i", "0.2", "-w", strconv.Itoa(int(mtuProbeDeadline / time.Second)), "-s", strconv.Itoa(size), "-I", source}
	if df {
		args = append(args, "-M", "do")
	}
	args = append(args, target)
	cctx, cancel := context.WithTimeout(ctx, mtuProbeDeadline+2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "ping", args...).CombinedOutput()
	return parsePing(string(out), err)
}

// parsePing reads ping's summary; a run with no summary is an error, with ping's words.
func parsePing(out string, runErr error) pingResult {
	var r pingResult
	if m := pingLocalError.FindString(out); m != "" {
		r.err = "ping: " + strings.TrimSpace(m)
	}
	m := pingSummary.FindStringSubmatch(out)
	if m == nil {
		if r.err == "" {
			msg := strings.TrimSpace(out)
			if len(msg) > 200 {
				msg = msg[:200]
			}
			r.err = fmt.Sprintf("ping: %v: %s", runErr, msg)
			var ee *exec.Error
			if errors.As(runErr, &ee) {
				r.err = "ping is not installed (iputils-ping): " + ee.Err.Error()
			}
		}
		return r
	}
	r.sent, _ = strconv.Atoi(m[1])
	r.received, _ = strconv.Atoi(m[2])
	return r
}

// probeDNS asks the agent's DNS server for dns-version.clusterset.local TXT.
func probeDNS(server string) diagnose.DNSProbe {
	r := diagnose.DNSProbe{Server: server}
	q := new(dns.Msg)
	q.SetQuestion("dns-version.clusterset.local.", dns.TypeTXT)
	c := &dns.Client{Timeout: 2 * time.Second}
	resp, rtt, err := c.Exchange(q, server)
	r.RTT = rtt
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Rcode = dns.RcodeToString[resp.Rcode]
	for _, rr := range resp.Answer {
		if txt, ok := rr.(*dns.TXT); ok {
			r.Answer = strings.Join(txt.Txt, "")
		}
	}
	return r
}

// lbHooks are the load balancer's cgroup hooks, by the name their link is pinned under
// (bpf/lb_linux.go: PinDir/links/lb_<name>).
var lbHooks = []struct {
	name   string
	attach ebpf.AttachType
}{
	{"connect4", ebpf.AttachCGroupInet4Connect},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername},
	{"connect6", ebpf.AttachCGroupInet6Connect},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername},
}

// probeEBPF looks for each hook's link pin and asks the kernel which programs the cgroup has
// attached for its attach type.
func probeEBPF(pinDir, cgroupPath string) diagnose.EBPFProbe {
	r := diagnose.EBPFProbe{PinDir: pinDir, CgroupPath: cgroupPath, Hooks: len(lbHooks)}
	cg, err := os.Open(cgroupPath)
	if err != nil {
		r.Error = fmt.Sprintf("cgroupPath: %v", err)
		return r
	}
	defer cg.Close()
	for _, h := range lbHooks {
		if _, err := os.Stat(filepath.Join(pinDir, "links", "lb_"+h.name)); err != nil {
			r.MissingPins = append(r.MissingPins, h.name)
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: h.attach})
		if err != nil {
			r.Error = fmt.Sprintf("query the programs of %s for %s: %v", cgroupPath, h.name, err)
			return r
		}
		if len(q.Programs) == 0 {
			r.Detached = append(r.Detached, h.name)
		}
	}
	return r
}
