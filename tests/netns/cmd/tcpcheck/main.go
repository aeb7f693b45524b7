// Command tcpcheck is the netns tests' TCP probe, run inside a namespace with `ip netns exec`
// (the test machines have no nc). It has three modes:
//
//	tcpcheck serve  -listen ADDR                 echo server; prints "listening ADDR" once bound
//	tcpcheck dial   -addr ADDR [-timeout 5s]     one connection, one echoed payload; prints "ok"
//	tcpcheck stream -addr ADDR -duration 10s     one connection kept busy echoing for the duration
//	                                             (or until SIGTERM/SIGINT, which end it as the
//	                                             duration does);
//	                                             any error (reset, stall past -timeout) exits 1;
//	                                             prints {"rounds","bytes","maxGapMs","gaps"}: the
//	                                             longest time between two completed echoes, and
//	                                             every gap over -gap-report (default 200ms)
//	tcpcheck transfer -addr ADDR -bytes N        sends N pseudo-random bytes through the echo
//	                                             server in full-size segments, reads them back and
//	                                             compares; prints {"bytes","ms","sha256"}
//	tcpcheck accept -listen ADDR [-timeout 5s]   echo server for one connection: prints
//	                                             "listening ADDR" once bound, then, for the first
//	                                             connection within -timeout of its start,
//	                                             {"mss":N,"peer":ADDR}: TCP_MAXSEG of the
//	                                             accepted socket, the MSS this end may send,
//	                                             bounded by the MSS option of the SYN as it
//	                                             arrived (after any clamping on the way); echoes
//	                                             until the peer closes
//	tcpcheck hello|udpecho|ask|udpask|asks|hold  the services modes: see services.go
//	tcpcheck capture -iface NAME -duration 10s   counts the IPv4 packets on a link: see capture.go
//
// Exit codes: 0 ok, 1 the check failed, 2 bad usage.
package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tcpcheck serve|dial|stream|transfer|accept [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", ":7000", "serve: address to listen on")
	addr := fs.String("addr", "", "dial/stream: address to connect to")
	timeout := fs.Duration("timeout", 5*time.Second, "dial/stream: deadline of one connect or one echo")
	duration := fs.Duration("duration", 10*time.Second, "stream: how long to keep the connection busy")
	gapReport := fs.Duration("gap-report", 200*time.Millisecond, "stream: list every gap between echoes longer than this")
	size := fs.Int64("bytes", 4<<20, "transfer: how many bytes to send")
	reply := fs.String("reply", "", "hello/udpecho: what to answer")
	count := fs.Int("count", 1000, "connbench: how many connections")
	iface := fs.String("iface", "", "capture: the link to capture on")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*listen)
	case "dial":
		err = dial(*addr, *timeout)
	case "stream":
		err = stream(*addr, *timeout, *duration, *gapReport)
	case "transfer":
		err = transfer(*addr, *timeout, *size)
	case "accept":
		err = acceptOne(*listen, *timeout)
	case "hello":
		err = serveHello(*listen, *reply)
	case "udpecho":
		err = serveUDPEcho(*listen, *reply)
	case "ask":
		err = ask(*addr, *timeout)
	case "udpask":
		err = udpAsk(*addr, *timeout)
	case "asks":
		err = asks(*addr, *timeout, *duration)
	case "hold":
		err = hold(*addr, *timeout)
	case "capture":
		err = capture(*iface, *duration)
	case "connbench":
		err = connBench(*addr, *count, *timeout)
	case "rrbench":
		err = rrBench(*addr, *duration, *timeout)
	default:
		fmt.Fprintf(os.Stderr, "tcpcheck: unknown mode %q (want serve, dial, stream, transfer, accept, hello, udpecho, ask, udpask, asks, hold, capture, connbench or rrbench)\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpcheck:", err)
		os.Exit(1)
	}
}

func serve(listen string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept on %s: %w", listen, err)
		}
		// The connection's goroutine ends when the peer closes; the process is killed to stop.
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// acceptOne serves one connection and reports the MSS its SYN left it with.
func acceptOne(listen string, timeout time.Duration) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	defer ln.Close()
	fmt.Printf("listening %s\n", ln.Addr())
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	c, err := ln.Accept()
	if err != nil {
		return fmt.Errorf("accept on %s: %w", listen, err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var mss int
	var serr error
	if err := raw.Control(func(fd uintptr) { mss, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("getsockopt TCP_MAXSEG: %w", serr)
	}
	out, _ := json.Marshal(struct {
		MSS  int    `json:"mss"`
		Peer string `json:"peer"`
	}{mss, c.RemoteAddr().String()})
	fmt.Println(string(out))
	_ = c.SetDeadline(time.Now().Add(timeout))
	_, _ = io.Copy(c, c)
	return nil
}

func echo(c net.Conn, payload []byte, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write(payload); err != nil {
		return fmt.Errorf("write to %s: %w", c.RemoteAddr(), err)
	}
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read echo from %s: %w", c.RemoteAddr(), err)
	}
	if !bytes.Equal(got, payload) {
		return errors.New("echo differs from what was sent")
	}
	return nil
}

func dial(addr string, timeout time.Duration) error {
	if addr == "" {
		return errors.New("-addr is required")
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fmt.Errorf("connect %s: %w", addr, err)
	}
	defer c.Close()
	payload := make([]byte, 1024)
	_, _ = rand.Read(payload)
	if err := echo(c, payload, timeout); err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}

// Gap is one pause of the stream: it ended AtMs after the stream began and lasted Ms.
type Gap struct {
	AtMs float64 `json:"atMs"`
	Ms   float64 `json:"ms"`
}

// StreamResult is what stream prints (one JSON line on stdout), also when it fails.
type StreamResult struct {
	Rounds   int     `json:"rounds"`
	Bytes    int     `json:"bytes"`
	MaxGapMs float64 `json:"maxGapMs"`
	// Gaps are the pauses longer than -gap-report, in order.
	Gaps  []Gap  `json:"gaps"`
	Error string `json:"error,omitempty"`
}

// stream keeps one connection busy with 16 KiB echoes, 10ms apart, and measures the longest
// time between two completed echoes (the stall a reroute of the connection causes). A stall
// shorter than timeout is survived and measured; a longer one fails the stream.
func stream(addr string, timeout, duration, gapReport time.Duration) error {
	if addr == "" {
		return errors.New("-addr is required")
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fmt.Errorf("connect %s: %w", addr, err)
	}
	defer c.Close()
	payload := make([]byte, 16*1024)
	res := StreamResult{Gaps: []Gap{}}
	start := time.Now()
	last := start
	end := start.Add(duration)
	// A signal ends the stream like its duration does, for a caller that cannot tell in
	// advance how long the stream must run.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	for time.Now().Before(end) {
		select {
		case <-stop:
			end = time.Now()
			continue
		default:
		}
		_, _ = rand.Read(payload)
		if err := echo(c, payload, timeout); err != nil {
			res.Error = fmt.Sprintf("after %d echoes: %v", res.Rounds, err)
			_ = json.NewEncoder(os.Stdout).Encode(res)
			return errors.New(res.Error)
		}
		now := time.Now()
		// The pacing sleep is part of every gap; it is subtracted so that a gap is the time the
		// network made the stream wait.
		gap := now.Sub(last)
		if res.Rounds > 0 {
			gap -= pace
		}
		ms := float64(gap.Microseconds()) / 1000
		if ms > res.MaxGapMs {
			res.MaxGapMs = ms
		}
		if gap > gapReport {
			res.Gaps = append(res.Gaps, Gap{AtMs: float64(now.Sub(start).Milliseconds()), Ms: ms})
		}
		last = now
		res.Rounds++
		res.Bytes += len(payload)
		// Pace the stream: the point is an uninterrupted connection, not throughput.
		time.Sleep(pace)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

const pace = 10 * time.Millisecond

// transfer sends size bytes through the echo server while reading the echo back concurrently,
// so both directions carry full-size segments, and checks that what came back is what was sent.
func transfer(addr string, timeout time.Duration, size int64) error {
	if addr == "" {
		return errors.New("-addr is required")
	}
	if size <= 0 {
		return fmt.Errorf("-bytes %d: want > 0", size)
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fmt.Errorf("connect %s: %w", addr, err)
	}
	defer c.Close()
	// The whole transfer gets timeout per MiB on top of one timeout, which a working path meets
	// by orders of magnitude and a black-holed one (lost big segments) does not.
	deadline := time.Now().Add(timeout + time.Duration(size>>20)*timeout)
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	start := time.Now()
	sent := sha256.New()
	writeErr := make(chan error, 1)
	// The writer goroutine is owned by transfer: it ends when it has written everything or the
	// connection fails (the deadline bounds it); transfer waits for it before returning.
	go func() {
		buf := make([]byte, 64*1024)
		var n int64
		for n < size {
			chunk := buf[:min(int64(len(buf)), size-n)]
			_, _ = rand.Read(chunk)
			sent.Write(chunk)
			if _, err := c.Write(chunk); err != nil {
				writeErr <- fmt.Errorf("write to %s after %d bytes: %w", addr, n, err)
				return
			}
			n += int64(len(chunk))
		}
		writeErr <- nil
	}()
	got := sha256.New()
	n, err := io.CopyN(got, c, size)
	werr := <-writeErr
	if werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("read echo from %s after %d of %d bytes: %w", addr, n, size, err)
	}
	if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		return errors.New("the echoed bytes differ from what was sent")
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"bytes": size, "ms": time.Since(start).Milliseconds(), "sha256": hex.EncodeToString(got.Sum(nil)),
	})
}
