// Command tcpcheck is the netns tests' TCP probe, run inside a namespace with `ip netns exec`
// (the test machines have no nc). It has three modes:
//
//	tcpcheck serve  -listen ADDR                 echo server; prints "listening ADDR" once bound
//	tcpcheck dial   -addr ADDR [-timeout 5s]     one connection, one echoed payload; prints "ok"
//	tcpcheck stream -addr ADDR -duration 10s     one connection kept busy echoing for the duration;
//	                                             any error (reset, stall past -timeout) exits 1
//
// Exit codes: 0 ok, 1 the check failed, 2 bad usage.
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tcpcheck serve|dial|stream [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", ":7000", "serve: address to listen on")
	addr := fs.String("addr", "", "dial/stream: address to connect to")
	timeout := fs.Duration("timeout", 5*time.Second, "dial/stream: deadline of one connect or one echo")
	duration := fs.Duration("duration", 10*time.Second, "stream: how long to keep the connection busy")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*listen)
	case "dial":
		err = dial(*addr, *timeout)
	case "stream":
		err = stream(*addr, *timeout, *duration)
	default:
		fmt.Fprintf(os.Stderr, "tcpcheck: unknown mode %q (want serve, dial or stream)\n", os.Args[1])
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

func stream(addr string, timeout, duration time.Duration) error {
	if addr == "" {
		return errors.New("-addr is required")
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fmt.Errorf("connect %s: %w", addr, err)
	}
	defer c.Close()
	payload := make([]byte, 16*1024)
	var rounds, bytesEchoed int
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		_, _ = rand.Read(payload)
		if err := echo(c, payload, timeout); err != nil {
			return fmt.Errorf("after %d echoes: %w", rounds, err)
		}
		rounds++
		bytesEchoed += len(payload)
		// Pace the stream: the point is an uninterrupted connection, not throughput.
		time.Sleep(10 * time.Millisecond)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]int{"rounds": rounds, "bytes": bytesEchoed})
}
