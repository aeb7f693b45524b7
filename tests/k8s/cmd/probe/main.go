// Command probe is the program of the k8s stage's test pods (image docker.io/cablemesh/k8s-probe):
//
//	probe serve -text TEXT [-port 80] [-stream-port 81]
//	    answers every TCP connection on -port with TEXT and a newline, then closes it; on
//	    -stream-port it writes an 8-byte big-endian counter every 10 ms until the peer goes.
//	probe call [-dns ADDR] [-timeout D] HOST:PORT
//	    resolves HOST (through the DNS server ADDR when given, else the pod's resolver),
//	    connects and prints what the server answered.
//	call [-dns ADDR] [-timeout D] HOST:PORT
//	    the same as probe call: the image has this binary also at /call, so a demo pod is
//	    asked `kubectl exec POD -- /call HOST:PORT`.
//	probe stream [-for D] HOST:PORT
//	    reads the counter stream for D, reconnecting when the connection breaks, and prints one
//	    JSON object: the longest stall (no byte received), how many times it reconnected, the
//	    counters received and how many the server sent that never arrived on the old stream.
//
// It is a static Go binary on an empty base, so a pod of it needs no shell.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

func main() {
	// Invoked as /call (the same binary under a second name), it is `probe call`.
	if filepath.Base(os.Args[0]) == "call" {
		if err := call(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "call:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe serve|call|stream ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "call":
		err = call(os.Args[2:])
	case "stream":
		err = stream(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want serve, call or stream", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	text := fs.String("text", "", "the answer")
	port := fs.Int("port", 80, "the answering port")
	streamPort := fs.Int("stream-port", 81, "the counter stream's port (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *text == "" {
		return errors.New("serve: -text is required")
	}
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(*port))
	if err != nil {
		return err
	}
	if *streamPort != 0 {
		sl, err := net.Listen("tcp", ":"+strconv.Itoa(*streamPort))
		if err != nil {
			return err
		}
		go acceptLoop(sl, writeCounter)
	}
	acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintln(c, *text)
	})
	return nil
}

func acceptLoop(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go handle(c)
	}
}

// writeCounter sends 0, 1, 2, ... every 10 ms; the client tells a stall from the gap in time and
// a loss from the gap in the counter.
func writeCounter(c net.Conn) {
	defer c.Close()
	var buf [8]byte
	for n := uint64(0); ; n++ {
		binary.BigEndian.PutUint64(buf[:], n)
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(buf[:]); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func resolver(dnsAddr string) *net.Resolver {
	if dnsAddr == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, dnsAddr)
	}}
}

func call(args []string) error {
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	dnsAddr := fs.String("dns", "", "DNS server ip:port (default: the pod's resolver)")
	timeout := fs.Duration("timeout", 5*time.Second, "overall time limit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("call: want one HOST:PORT")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	host, port, err := net.SplitHostPort(fs.Arg(0))
	if err != nil {
		return err
	}
	addrs, err := resolver(*dnsAddr).LookupHost(ctx, host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	d := net.Dialer{}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(addrs[0], port))
	if err != nil {
		return fmt.Errorf("connect %s (%s): %w", fs.Arg(0), addrs[0], err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
	}
	answer, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("read from %s: %w", addrs[0], err)
	}
	fmt.Printf("%s\nvia %s\n", bytes.TrimSpace(answer), addrs[0])
	return nil
}

// streamReport is what `probe stream` prints.
type streamReport struct {
	LongestStallMs int64  `json:"longestStallMs"`
	Reconnects     int    `json:"reconnects"`
	Received       uint64 `json:"received"`
	// Lost counts counters the server had sent on a stream that broke, as far as the client can
	// tell: it cannot see what was in flight when the stream broke, so it is 0 unless a gap
	// appears inside one stream (which TCP never allows).
	Lost     uint64   `json:"lost"`
	Duration int64    `json:"durationMs"`
	Errors   []string `json:"errors,omitempty"`
	// LongestStallEnd is when the longest stall ended (RFC 3339, ns): the test lines it up with
	// what happened to the agents meanwhile (every pod of the machine reads the same clock).
	LongestStallEnd string `json:"longestStallEnd,omitempty"`
}

func stream(args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	dur := fs.Duration("for", 30*time.Second, "how long to read")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("stream: want one HOST:PORT")
	}
	target := fs.Arg(0)
	start := time.Now()
	end := start.Add(*dur)
	var rep streamReport
	last := start
	connected := false
	for time.Now().Before(end) {
		c, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err != nil {
			if len(rep.Errors) < 20 {
				rep.Errors = append(rep.Errors, time.Since(start).Round(time.Millisecond).String()+": "+err.Error())
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if connected {
			rep.Reconnects++
		}
		connected = true
		var buf [8]byte
		want := uint64(0)
		for time.Now().Before(end) {
			// Long enough that a stall of the path (an agent restarting, say) shows as a stall
			// and not as a broken stream: TCP itself retransmits for minutes.
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			if _, err := io.ReadFull(c, buf[:]); err != nil {
				if len(rep.Errors) < 20 {
					rep.Errors = append(rep.Errors, time.Since(start).Round(time.Millisecond).String()+": "+err.Error())
				}
				break
			}
			now := time.Now()
			if stall := now.Sub(last).Milliseconds(); stall > rep.LongestStallMs {
				rep.LongestStallMs = stall
				rep.LongestStallEnd = now.UTC().Format(time.RFC3339Nano)
			}
			last = now
			if n := binary.BigEndian.Uint64(buf[:]); n > want {
				rep.Lost += n - want
				want = n
			}
			want++
			rep.Received++
		}
		c.Close()
	}
	if stall := time.Since(last).Milliseconds(); stall > rep.LongestStallMs {
		rep.LongestStallMs = stall
		rep.LongestStallEnd = time.Now().UTC().Format(time.RFC3339Nano)
	}
	rep.Duration = time.Since(start).Milliseconds()
	return json.NewEncoder(os.Stdout).Encode(rep)
}
