package netns

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// The kernel ingress data plane (agent/ingress/nftables) on a real kernel, without an
// agent: four namespaces
//
//	client 10.0.1.2 ── 10.0.1.1 gwa 192.168.77.1 ══ 192.168.77.2 gwb 10.0.2.1 ── 10.0.2.10, .11 backend
//	                       mesh 242.0.0.1 (cbl-mesh0)   mesh 242.0.0.2 (cbl-mesh0)
//
// where the gwa–gwb veth stands in for the cable (G3's gateway test runs the real one). gwa SNATs
// traffic to 242.0.0.2 to 242.0.0.1; gwb serves ingress ports on 242.0.0.2 by DNAT to the backends.
// The data plane runs in each gateway namespace as the tests/netns/cmd/ingressnft helper.

const ingressNSPrefix = nstest.Prefix("cbtn") // "cbt" + a non-hex letter: not harness's sweep pattern

// ingressAnswer is what `ingressnft ask` prints.
type ingressAnswer struct {
	Reply string  `json:"reply"`
	Error string  `json:"error"`
	Errno int     `json:"errno"`
	Ms    float64 `json:"ms"`
}

// name and peer split "NAME PEER" (the reply of the backends' tcpcheck hello and udpecho).
func (a ingressAnswer) name() string { f := strings.Fields(a.Reply); return first(f, 0) }
func (a ingressAnswer) peerIP() string {
	p := first(strings.Fields(a.Reply), 1)
	if i := strings.LastIndex(p, ":"); i > 0 {
		return p[:i]
	}
	return p
}

func first(f []string, i int) string {
	if len(f) > i {
		return f[i]
	}
	return ""
}

type ingressEnv struct {
	t                         *testing.T
	bin                       string // tests/netns/cmd/ingressnft
	tcpcheck                  string // the backends' servers
	client, gwa, gwb, backend string
}

func (e *ingressEnv) ask(ns, addr string, udp bool) ingressAnswer {
	e.t.Helper()
	args := []string{"ip", "netns", "exec", ns, e.bin, "ask", "-addr", addr, "-timeout", "3s"}
	if udp {
		args = append(args, "-udp")
	}
	out := nstest.MustRun(e.t, args...)
	var a ingressAnswer
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &a); err != nil {
		e.t.Fatalf("ask %s from %s: bad output %q: %v", addr, ns, out, err)
	}
	return a
}

// apply runs `ingressnft apply` in ns; the error carries stderr.
func (e *ingressEnv) apply(ns, cfg string) (string, error) {
	return nstest.Run("ip", "netns", "exec", ns, e.bin, "apply", "-mesh-link", "-config", cfg)
}

func (e *ingressEnv) mustApply(ns, cfg string) {
	e.t.Helper()
	if out, err := e.apply(ns, cfg); err != nil {
		e.t.Fatalf("apply in %s: %v", ns, err)
	} else {
		e.t.Logf("applied in %s: %s", ns, strings.TrimSpace(out))
	}
}

func (e *ingressEnv) dump(ns string) string {
	e.t.Helper()
	return nstest.MustRun(e.t, "ip", "netns", "exec", ns, e.bin, "dump")
}

// start runs `tcpcheck MODE args...` (hello or udpecho) in ns until the test ends and waits until
// it listens.
func (e *ingressEnv) start(ns, mode string, args ...string) {
	e.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, e.tcpcheck, mode}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start tcpcheck %s %v: %v", mode, args, err)
	}
	e.t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() { // ends when the pipe closes, at the latest when the process is killed
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			select {
			case line <- s.Text():
			default:
			}
		}
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "listening") {
			e.t.Fatalf("tcpcheck %s %v: %q", mode, args, l)
		}
	case <-time.After(10 * time.Second):
		e.t.Fatalf("tcpcheck %s %v did not start listening", mode, args)
	}
}

func ingressCfg(mesh, remote string, services string) string {
	return fmt.Sprintf(`{"MeshAddress":%q,"RemoteMeshAddresses":[%q],"Services":%s}`, mesh, remote, services)
}

const (
	gwaMesh = "242.0.0.1"
	gwbMesh = "242.0.0.2"
	// gwb's services: web has two backends, dns one, two ports none.
	svcTwoBackends = `[
	 {"Namespace":"ns","Name":"web","Ports":[{"Name":"http","Protocol":"TCP","IngressPort":30001,"Backends":["10.0.2.10:8080","10.0.2.11:8080"]}]},
	 {"Namespace":"ns","Name":"dns","Ports":[{"Name":"dns","Protocol":"UDP","IngressPort":30002,"Backends":["10.0.2.10:5353"]}]},
	 {"Namespace":"ns","Name":"gone","Ports":[{"Name":"t","Protocol":"TCP","IngressPort":30003},{"Name":"u","Protocol":"UDP","IngressPort":30004}]}]`
	svcOneBackend = `[
	 {"Namespace":"ns","Name":"web","Ports":[{"Name":"http","Protocol":"TCP","IngressPort":30001,"Backends":["10.0.2.10:8080"]}]},
	 {"Namespace":"ns","Name":"dns","Ports":[{"Name":"dns","Protocol":"UDP","IngressPort":30002,"Backends":["10.0.2.10:5353"]}]},
	 {"Namespace":"ns","Name":"gone","Ports":[{"Name":"t","Protocol":"TCP","IngressPort":30003},{"Name":"u","Protocol":"UDP","IngressPort":30004}]}]`
)

func setupIngressEnv(t *testing.T) *ingressEnv {
	t.Helper()
	nstest.RequireRoot(t, "creates network namespaces and nftables tables", "ip", "go")
	bins, err := harness.Build(context.Background())
	if err != nil {
		t.Fatalf("build the test binaries: %v", err)
	}
	e := &ingressEnv{t: t, bin: nstest.Binary(t, t.TempDir(), "./tests/netns/cmd/ingressnft"), tcpcheck: bins.TCPCheck}
	p := ingressNSPrefix
	e.client, e.gwa, e.gwb, e.backend = p.Add(t, "client"), p.Add(t, "gwa"), p.Add(t, "gwb"), p.Add(t, "backend")
	for _, ns := range []string{e.client, e.gwa, e.gwb, e.backend} {
		nstest.MustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	nstest.Veth(t, e.client, "c0", "10.0.1.2/24", e.gwa, "a0", "10.0.1.1/24")
	nstest.Veth(t, e.gwa, "a1", "192.168.77.1/30", e.gwb, "b1", "192.168.77.2/30")
	nstest.Veth(t, e.gwb, "b0", "10.0.2.1/24", e.backend, "p0", "10.0.2.10/24")
	nstest.MustRun(t, "ip", "-n", e.backend, "addr", "add", "10.0.2.11/24", "dev", "p0")
	nstest.MustRun(t, "ip", "-n", e.client, "route", "add", "default", "via", "10.0.1.1")
	nstest.MustRun(t, "ip", "-n", e.backend, "route", "add", "default", "via", "10.0.2.1")
	for _, ns := range []string{e.gwa, e.gwb} {
		nstest.MustRun(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	}
	for _, l := range [][2]string{{e.client, "c0"}, {e.gwa, "a0"}, {e.gwa, "a1"}, {e.gwb, "b1"}, {e.gwb, "b0"}, {e.backend, "p0"}} {
		nstest.WaitLinkUp(t, l[0], l[1])
	}

	e.mustApply(e.gwa, ingressCfg(gwaMesh, gwbMesh, "null"))
	e.mustApply(e.gwb, ingressCfg(gwbMesh, gwaMesh, svcTwoBackends))
	// The "cable": each gateway routes the other's mesh /32 over the veth, from its own mesh
	// address (what RemoteEndpoint.LocalSubnets makes the real drivers do).
	nstest.MustRun(t, "ip", "-n", e.gwa, "route", "add", gwbMesh+"/32", "via", "192.168.77.2", "src", gwaMesh)
	nstest.MustRun(t, "ip", "-n", e.gwb, "route", "add", gwaMesh+"/32", "via", "192.168.77.1", "src", gwbMesh)

	e.start(e.backend, "hello", "-listen", "10.0.2.10:8080", "-reply", "b1 {peer}")
	e.start(e.backend, "hello", "-listen", "10.0.2.11:8080", "-reply", "b2 {peer}")
	e.start(e.backend, "udpecho", "-listen", "10.0.2.10:5353", "-reply", "u1 {peer}")
	return e
}

func TestIngressNftables(t *testing.T) {
	e := setupIngressEnv(t)
	web := gwbMesh + ":30001"

	t.Run("TCP through both gateways reaches both backends and they see the calling gateway's mesh address", func(t *testing.T) {
		e.t = t
		names := map[string]int{}
		for range 40 {
			a := e.ask(e.client, web, false)
			if a.Error != "" {
				t.Fatalf("ask %s: %s", web, a.Error)
			}
			if a.peerIP() != gwaMesh {
				t.Fatalf("backend %s saw source %s, want gwa's mesh address %s", a.name(), a.peerIP(), gwaMesh)
			}
			names[a.name()]++
		}
		if names["b1"] == 0 || names["b2"] == 0 || len(names) != 2 {
			t.Errorf("40 connections went to %v, want both b1 and b2 (numgen random)", names)
		}
		t.Logf("40 connections: %v", names)
	})

	t.Run("UDP reaches the backend with the calling gateway's mesh address as source", func(t *testing.T) {
		e.t = t
		a := e.ask(e.client, gwbMesh+":30002", true)
		if a.Error != "" || a.name() != "u1" || a.peerIP() != gwaMesh {
			t.Errorf("UDP ask = %+v, want u1 seeing %s", a, gwaMesh)
		}
	})

	t.Run("the gateways' own processes use the ingress too", func(t *testing.T) {
		e.t = t
		// gwa: routed from its mesh address; gwb: its own ingress through the output chain.
		if a := e.ask(e.gwa, web, false); a.Error != "" || a.peerIP() != gwaMesh {
			t.Errorf("from gwa: %+v, want a backend seeing %s", a, gwaMesh)
		}
		if a := e.ask(e.gwb, web, false); a.Error != "" || a.peerIP() != gwbMesh {
			t.Errorf("from gwb itself: %+v, want a backend seeing %s", a, gwbMesh)
		}
	})

	t.Run("a port without backends fails fast", func(t *testing.T) {
		e.t = t
		a := e.ask(e.client, gwbMesh+":30003", false)
		if a.Errno != int(syscall.ECONNREFUSED) || a.Ms > 1000 {
			t.Errorf("TCP to a port without backends: %+v, want ECONNREFUSED (a reset) well within 1s", a)
		}
		u := e.ask(e.client, gwbMesh+":30004", true)
		if u.Errno != int(syscall.ECONNREFUSED) || u.Ms > 1000 {
			t.Errorf("UDP to a port without backends: %+v, want ECONNREFUSED (port unreachable) well within 1s", u)
		}
	})

	t.Run("Apply is idempotent", func(t *testing.T) {
		e.t = t
		before := e.dump(e.gwb)
		if !strings.Contains(before, "Numgen") || !strings.Contains(before, "chain be-tcp-30001-1") {
			t.Fatalf("gwb's table lacks the numgen load balancing:\n%s", before)
		}
		e.mustApply(e.gwb, ingressCfg(gwbMesh, gwaMesh, svcTwoBackends))
		if after := e.dump(e.gwb); after != before {
			t.Errorf("a second Apply of the same Config changed the table:\n%s\nwas\n%s", after, before)
		}
	})

	t.Run("a bad Config is refused and the old rules keep working", func(t *testing.T) {
		e.t = t
		before := e.dump(e.gwb)
		bad := ingressCfg(gwbMesh, gwaMesh, `[{"Namespace":"ns","Name":"x","Ports":[{"Protocol":"TCP","IngressPort":30001},{"Protocol":"TCP","IngressPort":30001}]}]`)
		out, err := e.apply(e.gwb, bad)
		if err == nil || !strings.Contains(out, "IngressPort 30001/TCP: already used") {
			t.Fatalf("duplicate ingress port: err %v, output %q; want a refusal naming the field", err, out)
		}
		if after := e.dump(e.gwb); after != before {
			t.Errorf("a refused Config changed the table:\n%s", after)
		}
		if a := e.ask(e.client, web, false); a.Error != "" {
			t.Errorf("after the refusal: %+v", a)
		}
	})

	t.Run("removing a backend stops new connections to it and an established one survives the replace", func(t *testing.T) {
		e.t = t
		// Connections held open across the Apply (which replaces the table): their translation
		// lives in conntrack, so they keep working, even to the backend being removed. To know
		// where they go, only b2 serves while they are opened.
		e.mustApply(e.gwb, ingressCfg(gwbMesh, gwaMesh, strings.ReplaceAll(svcOneBackend, "10.0.2.10:8080", "10.0.2.11:8080")))
		type held struct {
			a   ingressAnswer
			err error
		}
		var helds []chan held
		for range 6 {
			ch := make(chan held, 1)
			helds = append(helds, ch)
			go func() { // ends with the ask command (timeout 3s after its 2s hold)
				out, err := nstest.Run("ip", "netns", "exec", e.client, e.bin, "ask", "-addr", web, "-timeout", "3s", "-hold", "2s")
				var a ingressAnswer
				if err == nil {
					err = json.Unmarshal([]byte(strings.TrimSpace(out)), &a)
				}
				ch <- held{a, err}
			}()
		}
		time.Sleep(500 * time.Millisecond) // the held connections are established (they greet at once)
		e.mustApply(e.gwb, ingressCfg(gwbMesh, gwaMesh, svcOneBackend))
		for i := range 20 {
			a := e.ask(e.client, web, false)
			if a.Error != "" || a.name() != "b1" {
				t.Fatalf("connection %d after removing b2: %+v, want b1", i, a)
			}
		}
		for i, ch := range helds {
			h := <-ch
			if h.err != nil || h.a.Error != "" || h.a.name() != "b2" {
				t.Errorf("held connection %d across the replace: %v %+v, want b2 still echoing", i, h.err, h.a)
			}
		}
	})

	t.Run("Cleanup leaves no table and no cbl-mesh0", func(t *testing.T) {
		e.t = t
		nstest.MustRun(t, "ip", "netns", "exec", e.gwb, e.bin, "cleanup")
		if d := strings.TrimSpace(e.dump(e.gwb)); d != "no table" {
			t.Errorf("after Cleanup: %s", d)
		}
		if out, err := nstest.Run("ip", "-n", e.gwb, "link", "show", "cbl-mesh0"); err == nil {
			t.Errorf("cbl-mesh0 still there after Cleanup: %s", out)
		}
		if a := e.ask(e.client, web, false); a.Error == "" {
			t.Errorf("the ingress still answers after Cleanup: %+v", a)
		}
	})
}
