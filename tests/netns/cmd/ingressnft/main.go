// Command ingressnft drives the kernel ingress data plane (agent/ingress/nftables) inside a network
// namespace for the netns tests and the ingress bench, run with `ip netns exec NS ingressnft ...`:
// a process of its own per call, so the data plane's netlink socket is opened in that namespace
// without the setns-on-a-thread pitfalls of doing it inside the test process.
//
//	ingressnft apply -config JSON [-mesh-link]   validates and applies an ingress.Config (JSON);
//	                                             -mesh-link first puts MeshAddress on cbl-mesh0;
//	                                             prints the Status as JSON; a refused Config exits 1
//	                                             with the error on stderr
//	ingressnft dump                              prints the table as text without rule handles
//	                                             ("no table" when absent): equal dumps = equal rules
//	ingressnft cleanup                           Dataplane.Cleanup: table and cbl-mesh0 removed
//	ingressnft ask -addr ADDR [-udp] [-timeout 2s]  one exchange with a tcpcheck hello (TCP: reads
//	              [-hold D]                      the greeting line) or udpecho (UDP: sends a datagram,
//	                                             reads one); prints {"reply","error","errno","ms"}
//	                                             and exits 0 either way (the test judges); -hold
//	                                             (TCP): after the greeting wait D, then check that
//	                                             a line still echoes on the same connection
//
// Exit codes: 0 ok, 1 failed, 2 bad usage.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/cablemesh/cablemesh/agent/ingress"
	ingressnft "github.com/cablemesh/cablemesh/agent/ingress/nftables"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ingressnft apply|dump|cleanup|ask [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	config := fs.String("config", "", "apply: the ingress.Config as JSON")
	meshLink := fs.Bool("mesh-link", false, "apply: put MeshAddress on cbl-mesh0 first")
	addr := fs.String("addr", "", "ask: address to ask")
	udp := fs.Bool("udp", false, "ask: UDP instead of TCP")
	timeout := fs.Duration("timeout", 2*time.Second, "ask: deadline of the exchange")
	hold := fs.Duration("hold", 0, "ask (TCP): wait this long after the greeting, then echo a line on the same connection")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "apply":
		err = apply(*config, *meshLink)
	case "dump":
		err = dump()
	case "cleanup":
		err = cleanup()
	case "ask":
		ask(*addr, *udp, *timeout, *hold)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingressnft:", err)
		os.Exit(1)
	}
}

func apply(js string, meshLink bool) error {
	var cfg ingress.Config
	dec := json.NewDecoder(strings.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return fmt.Errorf("decode -config: %w", err)
	}
	if meshLink && cfg.MeshAddress.IsValid() {
		if err := ingress.EnsureMeshLink(cfg.MeshAddress); err != nil {
			return err
		}
	}
	d, err := ingressnft.New(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Apply(context.Background(), cfg); err != nil {
		return err
	}
	b, _ := json.Marshal(d.Status())
	fmt.Println(string(b))
	return nil
}

func cleanup() error {
	d, err := ingressnft.New(nil)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Cleanup(context.Background())
}

// dump prints chains, rules (expressions without handles or transaction ids) and set elements.
func dump() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tabs, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	var tab *nftables.Table
	for _, t := range tabs {
		if t.Name == ingressnft.TableName {
			tab = t
		}
	}
	if tab == nil {
		fmt.Println("no table")
		return nil
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != tab.Name {
			continue
		}
		rules, err := c.GetRules(tab, ch)
		if err != nil {
			return fmt.Errorf("rules of %s: %w", ch.Name, err)
		}
		fmt.Printf("chain %s\n", ch.Name)
		for _, r := range rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok {
					l2 := *l
					l2.SetID = 0
					e = &l2
				}
				fmt.Printf(" %T%+v", e, e)
			}
			fmt.Println()
		}
	}
	sets, err := c.GetSets(tab)
	if err != nil {
		return fmt.Errorf("sets: %w", err)
	}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("elements of %s: %w", s.Name, err)
		}
		// The kernel lists a set's elements in hash order: sorted, equal sets print alike.
		var es []string
		for _, e := range elems {
			s := fmt.Sprint(e.Key)
			if e.VerdictData != nil {
				s += ":" + e.VerdictData.Chain
			}
			es = append(es, s)
		}
		slices.Sort(es)
		fmt.Printf("set %s %s\n", s.Name, strings.Join(es, " "))
	}
	return nil
}

// answer is what ask prints.
type answer struct {
	Reply string  `json:"reply,omitempty"`
	Error string  `json:"error,omitempty"`
	Errno int     `json:"errno,omitempty"`
	Ms    float64 `json:"ms"`
}

func ask(addr string, udp bool, timeout, hold time.Duration) {
	start := time.Now()
	a := answer{}
	network := "tcp"
	if udp {
		network = "udp" // a connected socket: an ICMP port unreachable comes back as ECONNREFUSED
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err == nil {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		rd := bufio.NewReader(c)
		if udp {
			// One datagram each way; udpecho's reply has no newline.
			if _, err = c.Write([]byte("who\n")); err == nil {
				buf := make([]byte, 2048)
				var n int
				n, err = c.Read(buf)
				a.Reply = strings.TrimSpace(string(buf[:n]))
			}
		} else {
			var line string
			line, err = rd.ReadString('\n')
			a.Reply = strings.TrimSpace(line)
		}
		if err == nil && hold > 0 && !udp {
			time.Sleep(hold)
			_ = c.SetDeadline(time.Now().Add(timeout))
			if _, err = c.Write([]byte("still\n")); err == nil {
				var echo string
				if echo, err = rd.ReadString('\n'); err == nil && echo != "still\n" {
					err = fmt.Errorf("echo after holding: %q", echo)
				}
			}
		}
	}
	a.Ms = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		a.Error = err.Error()
		var en syscall.Errno
		if errors.As(err, &en) {
			a.Errno = int(en)
		}
	}
	b, _ := json.Marshal(a)
	fmt.Println(string(b))
}
